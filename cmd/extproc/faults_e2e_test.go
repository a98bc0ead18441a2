package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
)

// Fault tests (issue 8): each fault is played through the data plane against the real
// wiring, and each test ends with every booking gauge at exactly 0 and the goroutine
// count back at its baseline, polled with a generous deadline.

const settleDeadline = 20 * time.Second

var bookingGauges = []string{"kvroute_scoring_active_requests", "kvroute_scoring_active_blocks", "kvroute_scoring_prefill_tokens"}

// quiesce closes the idle keep-alive connections the test's clients hold, whose
// goroutines would otherwise count against the baseline.
func (d *deployment) quiesce() {
	d.envoy.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
}

// goroutineBaseline is the goroutine count of a warmed-up deployment: one request
// served and metrics read, idle connections closed, and the count settled.
func (d *deployment) goroutineBaseline(t *testing.T) int {
	t.Helper()
	status, _ := d.chat(t, context.Background(), "warm up", false)
	require.Equal(t, http.StatusOK, status)
	d.gaugeSum(t, bookingGauges[0])
	d.quiesce()
	// Let the goroutines of closed connections exit before counting.
	last, stable := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(settleDeadline); stable < 20 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == last {
			stable++
		} else {
			stable = 0
		}
		last = n
	}
	return last
}

// requireRecovered waits until every booking gauge reads exactly 0 and the goroutine
// count is back at most at baseline; on failure it prints the goroutines. The loop
// reads the gauges from the registry /metrics serves (a scrape per poll would leave a
// connection's goroutine behind each time); /metrics is read once at the end.
func (d *deployment) requireRecovered(t *testing.T, baseline int) {
	t.Helper()
	var gauges map[string]float64
	var goroutines int
	recovered := false
	for deadline := time.Now().Add(settleDeadline); !recovered && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		gauges = d.bookingGauges(t)
		d.quiesce()
		goroutines = runtime.NumGoroutine()
		recovered = gauges[bookingGauges[0]] == 0 && gauges[bookingGauges[1]] == 0 && gauges[bookingGauges[2]] == 0 && goroutines <= baseline
	}
	if !recovered {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("not recovered after %s: booking gauges %v, %d goroutines against a baseline of %d\n%s", settleDeadline, gauges, goroutines, baseline, stacks.String())
	}
	d.requireNoLoad(t)
}

// bookingGauges sums each booking gauge over its workers, from kvroute's registry.
func (d *deployment) bookingGauges(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := d.app.registry.Gather()
	require.NoError(t, err)
	sums := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			sums[f.GetName()] += m.GetGauge().GetValue()
		}
	}
	out := map[string]float64{}
	for _, g := range bookingGauges {
		out[g] = sums[g]
	}
	return out
}

// chat sends one chat completion through the data plane and returns the status and the
// body (which may be cut short: err is then set in the returned body's reading).
func (d *deployment) chat(t *testing.T, ctx context.Context, content string, stream bool) (int, string) {
	t.Helper()
	resp, err := d.send(ctx, content, stream)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (d *deployment) send(ctx context.Context, content string, stream bool) (*http.Response, error) {
	body := fmt.Sprintf(`{"model":"qwen","stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, content)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.envoy.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("content-type", "application/json")
	return d.envoy.Client().Do(req)
}

func (d *deployment) counter(t *testing.T, name, labels string) string {
	t.Helper()
	for _, line := range strings.Split(d.scrape(t), "\n") {
		if strings.HasPrefix(line, name+labels+" ") {
			return strings.Fields(line)[1]
		}
	}
	return "0"
}

func TestFaultUpstreamKilledMidStream(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, nil)
			defer d.stop()
			baseline := d.goroutineBaseline(t)

			resp, err := d.send(context.Background(), "HANG_AFTER_FIRST_TOKEN", true)
			require.NoError(t, err)
			defer resp.Body.Close()
			reader := bufio.NewReader(resp.Body)
			line, err := reader.ReadString('\n')
			require.NoError(t, err)
			require.Contains(t, line, "t0", "the first token arrived")
			assert.Equal(t, 1.0, d.gaugeSum(t, "kvroute_scoring_active_requests"))

			killed := d.workers[resp.Header.Get("x-served-by")]
			killed.Kill()
			_, err = io.ReadAll(reader)
			assert.Error(t, err, "the client sees the stream reset, not a clean end")

			// Back to the baseline's topology (a restarted engine), so that the dead
			// server's goroutines cannot hide a leak in the count.
			require.NoError(t, killed.Restart())
			d.requireRecovered(t, baseline)
			assert.Equal(t, "1", d.counter(t, "kvroute_filter_completions_total", fmt.Sprintf(`{outcome="cancelled",worker=%q}`, resp.Header.Get("x-served-by"))))
		})
	}
}

func TestFaultUpstreamAnswers5xx(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, nil)
			defer d.stop()
			baseline := d.goroutineBaseline(t)
			for _, stream := range []bool{false, true} {
				status, body := d.chat(t, context.Background(), "FAIL_UPSTREAM", stream)
				assert.Equal(t, http.StatusServiceUnavailable, status)
				assert.Contains(t, body, "engine overloaded", "the upstream's own error reaches the client")
			}
			d.requireRecovered(t, baseline)
			total := 0
			for name := range d.workers {
				for _, c := range []struct{ name, labels string }{
					{"kvroute_filter_completions_total", fmt.Sprintf(`{outcome="upstream_error",worker=%q}`, name)},
					{"kvroute_worker_health_failures_total", fmt.Sprintf(`{source="response",worker=%q}`, name)},
				} {
					var n int
					_, _ = fmt.Sscan(d.counter(t, c.name, c.labels), &n)
					total += n
				}
			}
			assert.Equal(t, 4, total, "two released as upstream_error, two counted against their workers' health")
		})
	}
}

// TestFaultChatOfTinyValuesIsRoutedByLoad: a chat body of so many tiny JSON values
// that materialising them would take several times the body (here a message key
// holding 128 Ki zeros) is served, routed by load alone without its prompt, and counted
// as an "error" prompt fallback; nothing stays booked.
func TestFaultChatOfTinyValuesIsRoutedByLoad(t *testing.T) {
	body := `{"model":"qwen","messages":[{"role":"user","content":"hi","x":[` + strings.Repeat("0,", 128<<10) + `0]}]}`
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, nil)
			defer d.stop()
			baseline := d.goroutineBaseline(t)
			resp, err := d.envoy.Client().Post(d.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			d.requireRecovered(t, baseline)
			assert.Equal(t, "1", d.counter(t, "kvroute_router_prompt_fallbacks_total", `{reason="error"}`))
		})
	}
}

func TestFaultUnreachableUpstreamLeavesAndRejoins(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, fastHealth)
	defer d.stop()
	baseline := d.goroutineBaseline(t)
	dead := d.workers["w0"]
	dead.Kill()
	require.Eventually(t, func() bool { return d.eligible(t, "w0") == "0" }, settleDeadline, 5*time.Millisecond)

	for i := range 6 {
		status, body := d.chat(t, context.Background(), fmt.Sprintf("while w0 is out %d", i), false)
		require.Equal(t, http.StatusOK, status, body)
		assert.NotContains(t, body, "hello from w0")
	}
	require.NoError(t, dead.Restart())
	require.Eventually(t, func() bool { return d.eligible(t, "w0") == "1" }, settleDeadline, 5*time.Millisecond, "a healthy probe brings it back")
	// Ties between idle workers break at random: w0 is chosen again before long.
	n := 0
	require.Eventually(t, func() bool {
		n++
		status, body := d.chat(t, context.Background(), fmt.Sprintf("after the restart %d", n), false)
		return status == http.StatusOK && strings.Contains(body, "hello from w0")
	}, settleDeadline, time.Millisecond, "w0 serves again")
	d.requireRecovered(t, baseline)
}

// TestFaultClientCancelsAtEachStage cancels the client with the request at each stage of
// its life: kvroute holds the headers only, part of the body, a routed request waiting
// for its first token, and a generation mid-stream.
func TestFaultClientCancelsAtEachStage(t *testing.T) {
	body := `{"model":"qwen","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("a long question ", 200) + `"}]}`
	stages := []struct {
		name string
		// run sends the request and cancels it at its stage. sent receives the data
		// plane's ext_proc messages.
		run func(t *testing.T, d *deployment, sent <-chan *extprocv3.ProcessingRequest)
	}{
		{"at the headers", func(t *testing.T, d *deployment, sent <-chan *extprocv3.ProcessingRequest) {
			ctx, cancel := context.WithCancel(context.Background())
			pr, pw := io.Pipe()
			defer pw.Close()
			errs := do(d, ctx, pr)
			waitFor(t, sent, "request_headers", func(m *extprocv3.ProcessingRequest) bool { return m.GetRequestHeaders() != nil })
			cancel()
			pw.CloseWithError(errClientGone) // the transport waits for the body it is sending
			require.Error(t, <-errs)
		}},
		{"in the body", func(t *testing.T, d *deployment, sent <-chan *extprocv3.ProcessingRequest) {
			ctx, cancel := context.WithCancel(context.Background())
			pr, pw := io.Pipe()
			defer pw.Close()
			errs := do(d, ctx, pr)
			waitFor(t, sent, "request_headers", func(m *extprocv3.ProcessingRequest) bool { return m.GetRequestHeaders() != nil })
			_, err := io.WriteString(pw, body[:len(body)/2])
			require.NoError(t, err)
			if d.next.Filter.RequestBodyMode == "FULL_DUPLEX_STREAMED" {
				waitFor(t, sent, "request_body", func(m *extprocv3.ProcessingRequest) bool { return m.GetRequestBody() != nil })
			}
			cancel()
			pw.CloseWithError(errClientGone)
			require.Error(t, <-errs)
		}},
		{"before the first token", func(t *testing.T, d *deployment, _ <-chan *extprocv3.ProcessingRequest) {
			ctx, cancel := context.WithCancel(context.Background())
			errs := do(d, ctx, strings.NewReader(strings.Replace(body, "a long question", "HANG_BEFORE_FIRST_TOKEN", 1)))
			require.Eventually(t, func() bool { return d.gaugeSum(t, "kvroute_scoring_active_requests") == 1 }, settleDeadline, time.Millisecond, "routed and booked")
			cancel()
			require.Error(t, <-errs)
		}},
		{"mid-stream", func(t *testing.T, d *deployment, _ <-chan *extprocv3.ProcessingRequest) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := d.send(ctx, "HANG_AFTER_FIRST_TOKEN", true)
			require.NoError(t, err)
			defer resp.Body.Close()
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			require.NoError(t, err)
			require.Contains(t, line, "t0")
			cancel()
		}},
	}
	for _, m := range e2eModes {
		for _, stage := range stages {
			t.Run(m.name+"/"+stage.name, func(t *testing.T) {
				sent := make(chan *extprocv3.ProcessingRequest, 64)
				d := deployEnvoy(t, m.req, m.resp, nil, func(c *envoytest.Config) {
					c.OnProcessorMessage = func(path string, msg *extprocv3.ProcessingRequest) {
						select {
						case sent <- msg:
						default: // a test that does not read them
						}
					}
				}, discardLogger())
				defer d.stop()
				baseline := d.goroutineBaseline(t)
				for len(sent) > 0 {
					<-sent // the warm-up's
				}
				stage.run(t, d, sent)
				d.requireRecovered(t, baseline)
				status, _ := d.chat(t, context.Background(), "still serving", false)
				assert.Equal(t, http.StatusOK, status)
			})
		}
	}
}

var errClientGone = errors.New("the client went away")

// do posts body (a reader the test may hold open) with ctx; the error of the exchange
// (nil only if the response came and was read whole) arrives on the channel.
func do(d *deployment, ctx context.Context, body io.Reader) <-chan error {
	errs := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.envoy.URL+"/v1/chat/completions", body)
		if err != nil {
			errs <- err
			return
		}
		resp, err := d.envoy.Client().Do(req)
		if err != nil {
			errs <- err
			return
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		errs <- err
	}()
	return errs
}

func waitFor(t *testing.T, sent <-chan *extprocv3.ProcessingRequest, what string, match func(*extprocv3.ProcessingRequest) bool) {
	t.Helper()
	timeout := time.After(settleDeadline)
	for {
		select {
		case m := <-sent:
			if match(m) {
				return
			}
		case <-timeout:
			t.Fatalf("the data plane never sent %s", what)
		}
	}
}

// TestFaultKvrouteRestartedUnderTraffic: kvroute stops (draining) and comes back on the
// same address while clients keep sending. Requests while it is down fail closed (the
// data plane's 500, never an unrouted request reaching a worker), routing resumes once
// it is back, and neither instance keeps a booking or a goroutine.
func TestFaultKvrouteRestartedUnderTraffic(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, nil)
	baseline := d.goroutineBaseline(t)
	grpcAddr, adminAddr := d.grpcAddr, strings.TrimPrefix(d.adminURL, "http://")

	// Each answer is tagged with the phase its request started in.
	type answer struct{ phase, status int32 }
	const (
		running = iota
		down
		restarted
	)
	var phase atomic.Int32
	stop := make(chan struct{})
	answers := make(chan answer, 100_000)
	clientsDone := make(chan struct{})
	const clients = 4
	for c := range clients {
		go func() {
			defer func() { clientsDone <- struct{}{} }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				started := phase.Load()
				resp, err := d.send(context.Background(), fmt.Sprintf("client %d request %d", c, i), i%2 == 0)
				if err != nil {
					answers <- answer{started, -1}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answers <- answer{started, int32(resp.StatusCode)}
				if resp.StatusCode != http.StatusOK {
					time.Sleep(time.Millisecond) // pacing, not timing: fail-closed answers come fast
				}
			}
		}()
	}
	var seen []answer
	waitFor := func(want answer) {
		t.Helper()
		timeout := time.After(settleDeadline)
		for {
			select {
			case a := <-answers:
				seen = append(seen, a)
				if a == want {
					return
				}
			case <-timeout:
				t.Fatalf("no %d answer to a request started in phase %d within %s", want.status, want.phase, settleDeadline)
			}
		}
	}
	waitFor(answer{running, http.StatusOK})

	old := d.app
	phase.Store(down)
	d.stop()
	status, body := d.chat(t, context.Background(), "while kvroute is down", false)
	assert.Equal(t, http.StatusInternalServerError, status, "fails closed: status_on_error, %s", body)
	for name := range d.workers {
		assert.Zero(t, old.bookings.Load(name).ActiveRequests, "the stopped instance released every booking")
	}

	grpcLn, err := net.Listen("tcp", grpcAddr)
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", adminAddr)
	require.NoError(t, err)
	d.serve(t, grpcLn, adminLn)
	defer d.stop()
	phase.Store(restarted)
	waitFor(answer{restarted, http.StatusOK}) // routing resumed (the data plane reconnects on its own)
	close(stop)
	for range clients {
		<-clientsDone
	}
	close(answers)
	for a := range answers {
		seen = append(seen, a)
	}
	counts := map[answer]int{}
	for _, a := range seen {
		counts[a]++
	}
	t.Logf("answers (phase, status) while restarting under traffic: %v", counts)
	for a := range counts {
		assert.Contains(t, []int32{http.StatusOK, http.StatusInternalServerError, -1}, a.status, "only answers, fail-closed 500s or resets")
	}
	for _, ex := range d.envoy.Exchanges() {
		if ex.Status != http.StatusOK {
			assert.Empty(t, ex.Upstream, "a request kvroute did not route reached no worker")
			continue
		}
		named := ex.DynamicMetadata["envoy.lb"].Fields["x-gateway-destination-endpoint"].GetStringValue()
		assert.Equal(t, named, ex.Upstream, "every answered request went where kvroute said")
	}
	d.requireRecovered(t, baseline)
}
