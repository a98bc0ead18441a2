package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// fillWorkers starts one generation that hangs after its first token on each worker
// (max_active_requests_per_worker 1: the fleet is full); the cancels end them.
func (d *deployment) fillWorkers(t *testing.T) []context.CancelFunc {
	t.Helper()
	var cancels []context.CancelFunc
	for i := range len(d.workers) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		cancels = append(cancels, cancel)
		stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("HANG_AFTER_FIRST_TOKEN %d", i))}})
		require.True(t, stream.Next(), "stream %d started", i)
	}
	return cancels
}

// waitForNoBookings waits until no worker has a request booked: every one released.
func (d *deployment) waitForNoBookings(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		n := 0
		for name := range d.workers {
			n += d.app.bookings.Load(name).ActiveRequests
		}
		return n == 0
	}, 10*time.Second, 10*time.Millisecond, "every booking released")
}

// holdOne sends a chat of messages in the background and waits until flow control
// holds it (the only request held); its answer's error comes on the channel.
func (d *deployment) holdOne(t *testing.T, messages ...openai.ChatCompletionMessageParamUnion) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen", Messages: messages})
		done <- err
	}()
	d.waitForMetric(t, "kvroute_flow_control_queued_requests 1")
	return done
}

// waitForMetric waits until kvroute's metrics page has the line.
func (d *deployment) waitForMetric(t *testing.T, line string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(d.scrape(t), line+"\n") }, 10*time.Second, 5*time.Millisecond, "never: %s", line)
}

// TestWithFlowControlARequestNoWorkerCanTakeWaitsInsteadOfA429: the fleet is full
// (the shedding test's fleet, TestSheddingAnswers429WhenEveryWorkerIsFull, answers
// 429 here); with flow_control on the request is held and served when a generation
// ends.
func TestWithFlowControlARequestNoWorkerCanTakeWaitsInsteadOfA429(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled = 1, true })
	defer d.stop()
	cancels := d.fillWorkers(t)

	done := d.holdOne(t, openai.UserMessage("one more"))
	select {
	case err := <-done:
		t.Fatalf("answered while every worker was full: %v", err)
	default:
	}
	cancels[1]()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was never served")
	}
	metrics := d.scrape(t)
	assert.Contains(t, metrics, `kvroute_flow_control_requests_total{outcome="dispatched"} 1`)
	assert.Contains(t, metrics, "kvroute_flow_control_queued_requests 0")
	assert.NotContains(t, metrics, `kvroute_filter_requests_total{outcome="rate_limit_exceeded"}`)
	for _, cancel := range cancels {
		cancel()
	}
	d.waitForNoBookings(t)
}

// TestAtShutdownAHeldRequestGetsA503AtOnce: kvroute starts to drain while a request
// is held; the client gets a retryable 503 at once (another replica can serve it)
// rather than the stream cut at the end of the grace.
func TestAtShutdownAHeldRequestGetsA503AtOnce(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled = 1, true })
	stopped := false
	defer func() {
		if !stopped {
			d.stop()
		}
	}()
	d.fillWorkers(t)
	done := d.holdOne(t, openai.UserMessage("one more"))
	stopping := make(chan struct{})
	go func() { defer close(stopping); d.stop() }()
	stopped = true
	var err error
	select {
	case err = <-done:
	case <-stopping:
		t.Fatal("the drain ended before the held request was answered")
	}
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, 503, apiErr.StatusCode)
	assert.Equal(t, "shutting_down", apiErr.Code)
	<-stopping
}

// TestWithHolderWaitASessionTurnWaitsForItsWorker: every worker is busy, one of them
// with a session's long first turn; the session's next turn is held. Another worker
// frees first: with holder_wait the turn waits for its own worker and is served there.
func TestWithHolderWaitASessionTurnWaitsForItsWorker(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		func(c *config.Config) {
			c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled, c.FlowControl.HolderWait = 1, true, 5*time.Second
		})
	defer d.stop()
	first := "HANG_AFTER_FIRST_TOKEN " + strings.Repeat("a long first turn of a session ", 40)
	cancels := map[string]context.CancelFunc{}
	for i, prompt := range []string{first, "HANG_AFTER_FIRST_TOKEN 1", "HANG_AFTER_FIRST_TOKEN 2"} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}})
		require.True(t, stream.Next(), "stream %d started", i)
		cancels[prompt] = cancel
	}
	// The session's worker: the one whose active blocks are the long turn's.
	holder, most := "", 0
	for name := range d.workers {
		if n := d.app.bookings.Load(name).ActiveBlocks; n > most {
			holder, most = name, n
		}
	}
	require.NotEmpty(t, holder)

	done := d.holdOne(t, openai.UserMessage(first), openai.AssistantMessage("an answer"), openai.UserMessage("the second turn"))
	cancels["HANG_AFTER_FIRST_TOKEN 1"]() // another worker frees first
	require.Eventually(t, func() bool {
		n := 0
		for name := range d.workers {
			n += d.app.bookings.Load(name).ActiveRequests
		}
		return n == 2
	}, 10*time.Second, 5*time.Millisecond, "the other worker freed")
	select {
	case err := <-done:
		t.Fatalf("served while its worker was busy (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	cancels[first]()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("never served")
	}
	served := ""
	for name, w := range d.workers {
		for _, r := range w.Served() {
			if strings.Contains(string(r.Body), "the second turn") {
				served = name
			}
		}
	}
	assert.Equal(t, holder, served, "served by its session's worker")
}

// TestWithFlowControlTenantsTakeTurns: three requests of tenant a queue before one of
// tenant b (x-llm-d-inference-fairness-id); as one worker frees, tenant b's goes
// second, not last.
func TestWithFlowControlTenantsTakeTurns(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled = 1, true })
	defer d.stop()
	cancels := d.fillWorkers(t)

	var wg sync.WaitGroup
	for i, a := range []struct{ name, tenant string }{{"a1", "a"}, {"a2", "a"}, {"a3", "a"}, {"b1", "b"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("request " + a.name)}},
				option.WithHeader("x-llm-d-inference-fairness-id", a.tenant))
			assert.NoError(t, err, a.name)
		}()
		d.waitForMetric(t, fmt.Sprintf("kvroute_flow_control_queued_requests %d", i+1))
	}
	// One worker frees: the held requests run one at a time, each on the one free slot,
	// so that worker receives them in the order flow control sent them (the order their
	// clients see their answers end in may differ: a client's goroutine can be slower
	// to return than the next request is to run).
	cancels[0]()
	wg.Wait()
	name := regexp.MustCompile(`request ([ab][0-9])`)
	var received []string
	for _, w := range d.workers {
		for _, s := range w.Served() {
			if m := name.FindSubmatch(s.Body); m != nil {
				received = append(received, string(m[1]))
			}
		}
	}
	assert.Equal(t, []string{"a1", "b1", "a2", "a3"}, received)
}

// TestFlowControlWarnsOfConfigsItCannotWorkIn: at start kvroute says when flow control
// can hold nothing (no active-request limit, no objective header) and when Envoy's
// message timer may cut a held request (any body mode but FULL_DUPLEX_STREAMED, unless
// override_message_timeout lengthens it past max_wait).
func TestFlowControlWarnsOfConfigsItCannotWorkIn(t *testing.T) {
	const holdsNothing, timer = "flow_control holds nothing", "message_timeout must be longer than flow_control.max_wait"
	const short = "override_message_timeout is under max_wait plus a second"
	for _, tc := range []struct {
		name  string
		edit  func(*config.Config)
		warns []string
	}{
		{"off", func(c *config.Config) { c.FlowControl.Enabled = false }, nil},
		{"a limit, full duplex", func(c *config.Config) {}, nil},
		{"a limit, buffered", func(c *config.Config) { c.Filter.RequestBodyMode = filter.ModeBuffered }, []string{timer}},
		{"a limit, buffered, the timer overridden past max_wait", func(c *config.Config) {
			c.Filter.RequestBodyMode, c.FlowControl.OverrideMessageTimeout = filter.ModeBuffered, c.FlowControl.MaxWait+time.Second
		}, nil},
		{"a limit, buffered, the timer overridden short of max_wait", func(c *config.Config) {
			c.Filter.RequestBodyMode, c.FlowControl.OverrideMessageTimeout = filter.ModeBuffered, time.Second
		}, []string{short}},
		{"a limit, buffered, the timer overridden to max_wait, racing the 429", func(c *config.Config) {
			c.Filter.RequestBodyMode, c.FlowControl.OverrideMessageTimeout = filter.ModeBuffered, c.FlowControl.MaxWait
		}, []string{short}},
		{"no limit, objectives read", func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker = 0 }, nil},
		{"no limit, no objective header", func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker, c.Priority.Header = 0, "" }, []string{holdsNothing}},
		{"no limit, no objective header, held on saturation", func(c *config.Config) {
			c.Router.MaxActiveRequestsPerWorker, c.Priority.Header, c.FlowControl.HoldOnSaturation = 0, "", true
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.FlowControl.Enabled, cfg.Router.MaxActiveRequestsPerWorker, cfg.Filter.RequestBodyMode = true, 4, filter.ModeFullDuplex
			tc.edit(&cfg)
			logs := &lockedBuffer{}
			a := &app{cfg: cfg, log: slog.New(slog.NewTextHandler(logs, nil))}
			a.warnFlowControl()
			for _, w := range []string{holdsNothing, timer, short} {
				assert.Equal(t, slices.Contains(tc.warns, w), strings.Contains(logs.String(), w), "%q in %s", w, logs.String())
			}
		})
	}
}

// TestAHeldRequestOutlastsEnvoysMessageTimerWithOverrideMessageTimeout: outside
// FULL_DUPLEX_STREAMED Envoy answers 504 once a body waits past message_timeout (here
// 300 ms), so a request flow control holds longer is lost; with
// flow_control.override_message_timeout kvroute asks Envoy, as it holds the request,
// to restart the timer at that value, which Envoy honours within its
// max_message_timeout, and the request is served when a worker frees.
func TestAHeldRequestOutlastsEnvoysMessageTimerWithOverrideMessageTimeout(t *testing.T) {
	buffered, fullDuplex := extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	for _, tc := range []struct {
		name               string
		mode               extprocfilterv3.ProcessingMode_BodySendMode
		override, envoyMax time.Duration
		wantServed         bool
		wantRestarts       int
		wantIgnored        int
	}{
		{"none sent: Envoy's 504", buffered, 0, time.Minute, false, 0, 0},
		{"sent, within max_message_timeout: served", buffered, 30 * time.Second, time.Minute, true, 1, 0},
		{"sent, Envoy without max_message_timeout: ignored, 504", buffered, 30 * time.Second, 0, false, 0, 1},
		{"full duplex, no timer: none sent, served", fullDuplex, 30 * time.Second, time.Minute, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			respMode := extprocfilterv3.ProcessingMode_STREAMED // BUFFERED would hold the fillers' first tokens
			if tc.mode == fullDuplex {
				respMode = fullDuplex
			}
			d := deployEnvoy(t, tc.mode, respMode,
				func(c *config.Config) {
					c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled = 1, true
					c.FlowControl.OverrideMessageTimeout = tc.override
				},
				func(e *envoytest.Config) { e.MessageTimeout, e.MaxMessageTimeout = 300*time.Millisecond, tc.envoyMax },
				discardLogger())
			defer d.stop()
			cancels := d.fillWorkers(t)

			done := d.holdOne(t, openai.UserMessage("one more"))
			time.Sleep(900 * time.Millisecond) // three message timeouts
			cancels[0]()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the held request was never answered")
			}
			if tc.wantServed {
				require.NoError(t, err)
			} else {
				var apiErr *openai.Error
				require.ErrorAs(t, err, &apiErr)
				assert.Equal(t, 504, apiErr.StatusCode)
			}
			for _, cancel := range cancels {
				cancel()
			}
			d.waitForNoBookings(t)
			restarts, ignored := 0, 0
			for _, ex := range d.envoy.Exchanges() { // waits for every exchange to end
				restarts += len(ex.MessageTimerRestarts)
				ignored += ex.IgnoredTimerOverrides
			}
			assert.Equal(t, tc.wantRestarts, restarts)
			assert.Equal(t, tc.wantIgnored, ignored)
		})
	}
}
