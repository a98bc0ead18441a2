package filter_test

import (
	"context"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
)

// stallingRouter holds each decision until the test lets it go: kvroute slower than
// Envoy's message_timeout. A true from the gate also waits until kvroute has seen the
// stream end: the client's 504 can come before the stream's cancellation reaches the
// server, and a decision let go in between (a loaded CI machine) finds it still there.
type stallingRouter struct {
	filter.Router
	entered chan struct{}
	gate    chan bool
}

func (s stallingRouter) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	s.entered <- struct{}{}
	if <-s.gate {
		<-ctx.Done()
	}
	return s.Router.Route(ctx, req)
}

// TestFaultEnvoyMessageTimeout: kvroute answers after Envoy's message_timeout. The
// client gets Envoy's 504, and kvroute, finding the stream gone when its prompt is
// encoded, makes no decision: nothing is booked, and no worker is credited with the
// prompt's blocks (a decision used to be made, booked and released, and its blocks
// stayed recorded on a worker that was never sent them). The goroutines return to
// their baseline.
func TestFaultEnvoyMessageTimeout(t *testing.T) {
	stall := stallingRouter{entered: make(chan struct{}, 1), gate: make(chan bool)}
	p := newPlane(t, planeOptions{
		wrapRouter: func(r filter.Router) filter.Router { stall.Router = r; return stall },
		// message_timeout is Envoy's setting under test, not a test deadline: the test
		// waits on channels, whatever the timer's length. It also bounds every message
		// of the warm-up requests, which must not trip it on a saturated machine: two
		// seconds, rather than Envoy-like milliseconds, is what the stalled request waits.
		envoyCfg: func(c *envoytest.Config) { c.MessageTimeout = 2 * time.Second },
	})
	client := p.envoy.Client()
	warm := func() {
		t.Helper()
		go func() { <-stall.entered; stall.gate <- false }()
		resp, _ := p.post(t, "/v1/chat/completions", chat("warm up", false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	warm()
	p.envoy.CloseIdleConnections()
	baseline := settledGoroutines()

	statuses := make(chan int, 1)
	go func() {
		resp, err := client.Post(p.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat("too slow", false)))
		if err != nil {
			statuses <- -1
			return
		}
		resp.Body.Close()
		statuses <- resp.StatusCode
	}()
	<-stall.entered
	assert.Equal(t, http.StatusGatewayTimeout, <-statuses, "Envoy's local reply on a message timeout")
	entriesBefore := indexEntries(p)
	routedBefore := p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"})
	stall.gate <- true // kvroute would decide now, for a stream that is gone
	require.Eventually(t, func() bool {
		return p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "cancelled"}) == 1
	}, 20*time.Second, 2*time.Millisecond, "the late request is counted as cancelled")
	p.requireIdle(t)
	assert.Equal(t, routedBefore, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}), "and not as routed")
	assert.Zero(t, completions(t, p, "cancelled"), "nothing was booked, so nothing is released")
	ex := p.envoy.Exchanges()
	assert.Empty(t, ex[len(ex)-1].Upstream, "the request reached no worker")
	assert.Equal(t, entriesBefore, indexEntries(p), "no worker is credited with the late prompt's blocks")

	warm() // kvroute still serves
	p.envoy.CloseIdleConnections()
	requireGoroutinesBack(t, baseline, p.envoy.CloseIdleConnections)
}

// requireGoroutinesBack polls (in this goroutine: testify's Eventually runs its
// condition in goroutines of its own) until the count is at most baseline, calling
// quiesce before each count; on failure it prints the goroutines.
func requireGoroutinesBack(t *testing.T, baseline int, quiesce func()) {
	t.Helper()
	n := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		quiesce()
		if n = runtime.NumGoroutine(); n <= baseline {
			return
		}
	}
	var stacks strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
	t.Fatalf("%d goroutines, baseline %d:\n%s", n, baseline, stacks.String())
}

// settledGoroutines is the goroutine count once it has held still for 20 samples.
func settledGoroutines() int {
	last, stable := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(20 * time.Second); stable < 20 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		if n := runtime.NumGoroutine(); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
	return last
}

// indexEntries is the blocks the index holds for the plane's workers.
func indexEntries(p *plane) int {
	n := 0
	for _, w := range p.workers {
		n += p.index.WorkerEntries(w.name)
	}
	return n
}
