package flowcontrol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// fleet is a real router over one worker that takes one request at a time
// (max_active_requests_per_worker 1), behind flow control.
type fleet struct {
	router   *router.Router
	bookings *scoring.Bookings
	queue    *Queue
	registry *prometheus.Registry
	// panics counts the router's answers that panicked (loop flow_control), on registry.
	panics *background.Metrics
	// timeouts fires max_wait for the request waiting on it.
	timeouts chan time.Time
	// clock is flow control's (how long a request has been held).
	clock *fakeclock.Clock
	// noRetries stops the retry interval (set before the first request): a head is
	// tried again only when the ledger moves, so a test knows when it is.
	noRetries bool
}

// routerFunc wraps a router's Route (and keeps its Priority).
type routerFunc struct {
	*router.Router
	route func(ctx context.Context, req *router.Request) (*router.Decision, error)
}

func (r routerFunc) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	return r.route(ctx, req)
}

func newFleet(t *testing.T, cfg Config, wrap func(*router.Router) Router) *fleet {
	t.Helper()
	return newFleetOf(t, 1, cfg, wrap)
}

// newFleetOf is newFleet with n workers: wi at 127.0.0.1:(i+1).
func newFleetOf(t *testing.T, n int, cfg Config, wrap func(*router.Router) Router) *fleet {
	t.Helper()
	return newFleetWith(t, n, cfg, wrap, nil)
}

// newFleetWith is newFleetOf with the router's Deps edited (nil: none) before New.
func newFleetWith(t *testing.T, n int, cfg Config, wrap func(*router.Router) Router, edit func(*router.Deps)) *fleet {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	var workers []router.Worker
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		require.NoError(t, idx.SetWorker(name, 0))
		workers = append(workers, router.Worker{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", i+1), Models: []string{"m"}})
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	f := &fleet{bookings: scoring.NewBookings(), registry: prometheus.NewRegistry(), timeouts: make(chan time.Time),
		clock: fakeclock.New(time.Unix(1_800_000_000, 0))}
	f.panics = background.NewMetrics(f.registry)
	deps := router.Deps{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: f.bookings, Picker: picker, RecordBlocks: true,
		Objectives: priority.NewObjectives(map[string]int{"high": 5, "low": -1})}
	if edit != nil {
		edit(&deps)
	}
	f.router, err = router.New(router.Config{BlockSize: 4, MaxActiveRequestsPerWorker: 1, Workers: workers}, deps)
	require.NoError(t, err)
	var next Router = f.router
	if wrap != nil {
		next = wrap(f.router)
	}
	cfg.Enabled = true
	f.queue, err = New(cfg, Deps{Router: next, Ledger: f.bookings, Metrics: NewMetrics(f.registry), Panics: f.panics, Now: f.clock.Now,
		After: func(d time.Duration) <-chan time.Time {
			switch {
			case d == cfg.MaxWait:
				return f.timeouts
			case d == RetryInterval && f.noRetries:
				return nil
			}
			return time.After(d)
		}})
	require.NoError(t, err)
	return f
}

// settled waits until the dispatchers try nothing until the ledger moves: no head is
// being routed, and each queue for any worker has had its head refused at the
// ledger's version (a worker's queue waits for that worker to have room).
func (f *fleet) settled(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		f.queue.mu.Lock()
		defer f.queue.mu.Unlock()
		version := f.bookings.Version()
		for _, g := range f.queue.groups {
			for holder, mq := range g.queues {
				h := mq.head()
				if h == nil || h.state == stateRouting || (holder == "" && !(h.tried && h.triedVersion == version)) {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the dispatchers settle")
}

func request(prompt, objective, fairness string) *router.Request {
	return &router.Request{Model: "m", Prompt: prompt, Objective: objective, FairnessID: fairness}
}

// call is a request routed through the queue in its own goroutine.
type call struct {
	name     string
	decision *router.Decision
	err      error
	done     chan struct{}
	cancel   context.CancelFunc
}

// start routes req in a goroutine and waits until the queue holds it (held requests
// in all then).
func (f *fleet) start(t *testing.T, name string, req *router.Request, held int) *call {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &call{name: name, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(c.done)
		c.decision, c.err = f.queue.Route(ctx, req)
	}()
	require.Eventually(t, func() bool { return f.queue.Held() == held }, 10*time.Second, time.Millisecond, "%s is held", name)
	return c
}

func (c *call) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never returned", c.name)
	}
}

// servedOrFail waits for c, held, to be served; if it is not soon, its max_wait is
// ended (so that it returns) and the test fails with why.
func (f *fleet) servedOrFail(t *testing.T, c *call, why string) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		f.timeouts <- time.Now()
		c.wait(t)
		t.Fatal(why)
	}
}

func (f *fleet) active() int { return f.bookings.Load("w0").ActiveRequests }

func (f *fleet) outcomes(outcome string) float64 {
	return testutil.ToFloat64(f.queue.deps.Metrics.outcomes.WithLabelValues(outcome))
}

func TestARequestNoWorkerCanTakeWaitsForAFreeSlotInsteadOfA429(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	first, err := f.queue.Route(context.Background(), request("first", "", ""))
	require.NoError(t, err)

	second := f.start(t, "second", request("second", "", ""), 1)
	select {
	case <-second.done:
		t.Fatalf("the second request returned while the worker was full: %v", second.err)
	case <-time.After(20 * time.Millisecond):
	}
	require.True(t, first.Release())
	second.wait(t)
	require.NoError(t, second.err)
	assert.Equal(t, "w0", second.decision.Worker)
	assert.Equal(t, 0, f.queue.Held())
	assert.Equal(t, 1, f.active(), "the second request's booking")
	assert.Equal(t, 1.0, f.outcomes(OutcomeDispatched))
	second.decision.Release()
	assert.Equal(t, 0, f.active())
}

// TestHeldRequestsGoByPriorityThenFairnessIdThenArrival: with the worker full, eight
// requests queue; as the worker frees, the highest priority goes first, then the
// fairness ids of one priority take turns, each id's requests in arrival order, and
// the sheddable ones last.
func TestHeldRequestsGoByPriorityThenFairnessIdThenArrival(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)

	arrivals := []struct{ name, objective, fairness string }{
		{"a1", "", "tenant-a"}, {"a2", "", "tenant-a"}, {"a3", "", "tenant-a"},
		{"shed", "low", "tenant-a"},
		{"b1", "", "tenant-b"},
		{"urgent", "high", "tenant-c"},
		{"b2", "", "tenant-b"},
		{"none", "", ""},
	}
	calls := map[string]*call{}
	for i, a := range arrivals {
		calls[a.name] = f.start(t, a.name, request(a.name, a.objective, a.fairness), i+1)
	}
	// The sheddable request needs capacity by the engines' metrics, which this fleet has
	// none of: it waits out max_wait. The others go one at a time, as the worker frees.
	want := []string{"urgent", "a1", "b1", "none", "a2", "b2", "a3"}
	var got []string
	current := holder
	for range want {
		require.True(t, current.Release())
		var next *call
		require.Eventually(t, func() bool {
			for name, c := range calls {
				select {
				case <-c.done:
					next = c
					delete(calls, name)
					return true
				default:
				}
			}
			return false
		}, 10*time.Second, time.Millisecond)
		require.NoError(t, next.err, next.name)
		got = append(got, next.name)
		current = next.decision
	}
	assert.Equal(t, want, got)
	require.Len(t, calls, 1)
	f.timeouts <- time.Now()
	shed := calls["shed"]
	shed.wait(t)
	assert.ErrorIs(t, shed.err, ErrTimedOut)
	current.Release()
	assert.Equal(t, 0, f.active())
	assert.Equal(t, 0, f.queue.Held())
	assert.Equal(t, 7.0, f.outcomes(OutcomeDispatched))
	assert.Equal(t, 1.0, f.outcomes(OutcomeTimedOut))
}

func TestAHeldRequestEndsWith(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     func(f *fleet, c *call)
		wantErr error
		outcome string
	}{
		{"ErrTimedOut after max_wait", func(f *fleet, c *call) { f.timeouts <- time.Now() }, ErrTimedOut, OutcomeTimedOut},
		{"its context's error when the client goes away", func(f *fleet, c *call) { c.cancel() }, context.Canceled, OutcomeCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, DefaultConfig(), nil)
			holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
			require.NoError(t, err)
			c := f.start(t, "waiter", request("waiter", "", ""), 1)
			tc.end(f, c)
			c.wait(t)
			assert.ErrorIs(t, c.err, tc.wantErr)
			assert.Nil(t, c.decision)
			assert.Equal(t, 0, f.queue.Held(), "it left the queue")
			assert.Equal(t, 1.0, f.outcomes(tc.outcome))
			holder.Release()
			assert.Equal(t, 0, f.active(), "nothing was booked for it")
			// The queue is gone with its last request: the next one is routed at once.
			next, err := f.queue.Route(context.Background(), request("next", "", ""))
			require.NoError(t, err)
			next.Release()
		})
	}
}

func TestAFullQueueRefusesAtOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxQueued = 1
	f := newFleet(t, cfg, nil)
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	waiter := f.start(t, "waiter", request("waiter", "", ""), 1)
	_, err = f.queue.Route(context.Background(), request("one more", "", ""))
	assert.ErrorIs(t, err, ErrQueueFull)
	assert.Equal(t, 1.0, f.outcomes(OutcomeQueueFull))
	holder.Release()
	waiter.wait(t)
	require.NoError(t, waiter.err)
	waiter.decision.Release()
}

// TestADecisionMadeAsItsClientLeftIsReleased: the client goes away while the
// dispatcher is routing its request; the worker takes it: the booking is released, not
// leaked, and the client gets its context's error.
func TestADecisionMadeAsItsClientLeftIsReleased(t *testing.T) {
	entered, gate, decided := make(chan struct{}), make(chan struct{}), make(chan bool, 1)
	var calls sync.Map // prompt → Route calls
	f := newFleet(t, DefaultConfig(), func(r *router.Router) Router {
		return routerFunc{Router: r, route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			n, _ := calls.LoadOrStore(req.Prompt, new(int))
			*n.(*int)++
			if req.Prompt == "slow" && *n.(*int) == 2 {
				close(entered)
				<-gate
				// The router decided before it saw the context end.
				d, err := r.Route(context.WithoutCancel(ctx), req)
				decided <- d != nil
				return d, err
			}
			return r.Route(ctx, req)
		}}
	})
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	slow := f.start(t, "slow", request("slow", "", ""), 1)
	holder.Release()
	<-entered
	slow.cancel()
	select {
	case <-slow.done:
		t.Fatal("returned while its routing was under way")
	case <-time.After(20 * time.Millisecond):
	}
	close(gate)
	slow.wait(t)
	require.True(t, <-decided, "the worker took it")
	assert.ErrorIs(t, slow.err, context.Canceled)
	assert.Nil(t, slow.decision)
	assert.Equal(t, 0, f.active(), "the decision made for it was released")
	assert.Equal(t, 1.0, f.outcomes(OutcomeCancelled))
}

// TestANewcomerWaitsBehindTheHeldRequests: while a model's queue holds requests, one
// more is not tried before them, though the router might take it.
func TestANewcomerWaitsBehindTheHeldRequests(t *testing.T) {
	var mu sync.Mutex
	var routed []string
	f := newFleet(t, DefaultConfig(), func(r *router.Router) Router {
		return routerFunc{Router: r, route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			d, err := r.Route(ctx, req)
			if err == nil {
				mu.Lock()
				routed = append(routed, req.Prompt)
				mu.Unlock()
			}
			return d, err
		}}
	})
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	first := f.start(t, "first", request("first", "", ""), 1)
	second := f.start(t, "second", request("second", "", ""), 2)
	holder.Release()
	first.wait(t)
	require.NoError(t, first.err)
	first.decision.Release()
	second.wait(t)
	require.NoError(t, second.err)
	second.decision.Release()
	assert.Equal(t, []string{"holder", "first", "second"}, routed)
}

func TestOffFlowControlAnswersTheRoutersRefusalAtOnce(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	f.queue.cfg.Enabled = false
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	_, err = f.queue.Route(context.Background(), request("second", "", ""))
	assert.ErrorIs(t, err, router.ErrOverloaded)
	holder.Release()
}

// TestOtherErrorsAreNotHeld: a request the router refuses for another reason than
// capacity gets that refusal at once.
func TestOtherErrorsAreNotHeld(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	_, err = f.queue.Route(context.Background(), &router.Request{Model: "unknown", Prompt: "x"})
	assert.ErrorIs(t, err, router.ErrModelNotFound)
	assert.Equal(t, 0, f.queue.Held())
	holder.Release()
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"no wait", func(c *Config) { c.MaxWait = 0 }, "flow_control.max_wait"},
		{"a wait past an hour", func(c *Config) { c.MaxWait = 2 * time.Hour }, "flow_control.max_wait"},
		{"no room", func(c *Config) { c.MaxQueued = 0 }, "flow_control.max_queued"},
		{"too much room", func(c *Config) { c.MaxQueued = MaxMaxQueued + 1 }, "flow_control.max_queued"},
		{"a header with a space", func(c *Config) { c.FairnessHeader = "x tenant" }, "flow_control.fairness_header"},
		{"no header: one flow", func(c *Config) { c.FairnessHeader = "" }, ""},
		// Envoy's max_message_timeout is at most 1h (ext_proc.proto's validation): a
		// longer override is always ignored, and the held request gets Envoy's 504.
		{"a timer override of Envoy's longest", func(c *Config) { c.OverrideMessageTimeout = time.Hour }, ""},
		{"a timer override Envoy can never honour", func(c *Config) { c.OverrideMessageTimeout = time.Hour + time.Second }, "flow_control.override_message_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "%v", err)
		})
	}
}

func TestHeadersReadTheDefaultAndItsAliasOnlyWhenEnabled(t *testing.T) {
	c := DefaultConfig()
	assert.Nil(t, c.Headers(), "off")
	c.Enabled = true
	assert.Equal(t, []string{DefaultFairnessHeader, LegacyFairnessHeader}, c.Headers())
	c.FairnessHeader = LegacyFairnessHeader
	assert.Equal(t, []string{DefaultFairnessHeader, LegacyFairnessHeader}, c.Headers())
	c.FairnessHeader = "X-Tenant"
	assert.Equal(t, []string{"x-tenant"}, c.Headers())
	c.FairnessHeader = ""
	assert.Nil(t, c.Headers())
}

func TestValidFairnessID(t *testing.T) {
	for id, want := range map[string]bool{
		"tenant-a": true, "": false, strings.Repeat("a", MaxFairnessIDBytes): true,
		strings.Repeat("a", MaxFairnessIDBytes+1): false, "a b": false, "é": false, "a\x00": false,
	} {
		assert.Equal(t, want, ValidFairnessID(id), "%q", id)
	}
}

// TestAFlowThatComesBackWaitsItsTurn: tenant c waits with its second request while
// tenants a and b, one request at a time, send their next as their last goes. A flow
// that empties leaves and comes back with its next request: it joins the end of the
// line, behind c, which goes third, not after every request a and b keep sending
// (until its max_wait).
func TestAFlowThatComesBackWaitsItsTurn(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	calls := map[string]*call{}
	held := 0
	send := func(name, tenant string) {
		held++
		calls[name] = f.start(t, name, request(name, "", tenant), held)
	}
	// next frees the worker and returns the request that got it.
	current := holder
	next := func() string {
		t.Helper()
		require.True(t, current.Release())
		held--
		var got *call
		require.Eventually(t, func() bool {
			for name, c := range calls {
				select {
				case <-c.done:
					got = c
					delete(calls, name)
					return true
				default:
				}
			}
			return false
		}, 10*time.Second, time.Millisecond)
		require.NoError(t, got.err, got.name)
		current = got.decision
		return got.name
	}
	send("c1", "c")
	send("c2", "c")
	send("a1", "a")
	assert.Equal(t, "c1", next())
	send("b1", "b") // behind a and c
	assert.Equal(t, "a1", next())
	send("a2", "a") // a comes back, behind c and b
	assert.Equal(t, "c2", next(), "c waited since before a went and b came")
	assert.Equal(t, "b1", next())
	send("b2", "b") // b comes back, behind a
	assert.Equal(t, "a2", next())
	assert.Equal(t, "b2", next())
	current.Release()
	assert.Equal(t, 0, f.queue.Held())
	assert.Equal(t, 0, f.active())
}

// TestAResultCountsAs: the outcome of a held request whose result came from the
// dispatcher. A routing that found the client gone returns its context's error, and
// when that result reaches the request before its wait sees the context end (wait's
// select takes either), the request was cancelled all the same.
func TestAResultCountsAs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		result  func(ctx context.Context) routed
		cancel  bool
		outcome string
	}{
		{"cancelled when it is its ended context's error", func(ctx context.Context) routed { return routed{err: ctx.Err()} }, true, OutcomeCancelled},
		{"failed when it is another error", func(context.Context) routed { return routed{err: router.ErrNoWorkers} }, true, OutcomeFailed},
		{"failed when it is a context error of a live context", func(context.Context) routed { return routed{err: context.Canceled} }, false, OutcomeFailed},
		{"dispatched when it is a decision", func(context.Context) routed { return routed{decision: &router.Decision{}} }, true, OutcomeDispatched},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, DefaultConfig(), nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			w := &waiter{ctx: ctx, since: time.Now()}
			r := tc.result(ctx)
			d, err := f.queue.took(w, r)
			assert.Equal(t, r.decision, d)
			assert.Equal(t, r.err, err)
			for _, o := range []string{OutcomeDispatched, OutcomeCancelled, OutcomeFailed} {
				want := 0.0
				if o == tc.outcome {
					want = 1
				}
				assert.Equal(t, want, f.outcomes(o), o)
			}
		})
	}
}

// TestARoutingThatPanicsFailsItsRequestAlone: the router panics routing a held
// request (a collaborator's bug). The process goes on: the request's own goroutine
// panics (its stream's server recovery fails that stream alone, as for a request
// routed at once), and the queue serves the requests behind it.
func TestARoutingThatPanicsFailsItsRequestAlone(t *testing.T) {
	// The bomb panics when a try of it would route it (the worker freed), whenever
	// that try comes: an armed flag set before the holder's release raced a retry
	// interval's try that began unarmed and then found the worker free (seen once on a
	// loaded CI machine: the bomb routed, no panic).
	f := newFleet(t, DefaultConfig(), func(r *router.Router) Router {
		return routerFunc{Router: r, route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			d, err := r.Route(ctx, req)
			if req.Prompt == "bomb" && err == nil {
				d.Release()
				panic("injected fault")
			}
			return d, err
		}}
	})
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)

	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_, _ = f.queue.Route(context.Background(), request("bomb", "", ""))
	}()
	require.Eventually(t, func() bool { return f.queue.Held() == 1 }, 10*time.Second, time.Millisecond)
	behind := f.start(t, "behind", request("behind", "", ""), 2)

	// The dispatcher's try of the bomb once the worker frees panics.
	holder.Release()
	select {
	case p := <-panicked:
		require.NotNil(t, p, "the bomb's Route returned")
		assert.ErrorContains(t, p.(error), "injected fault")
	case <-time.After(10 * time.Second):
		t.Fatal("the bomb's Route never ended")
	}
	behind.wait(t)
	require.NoError(t, behind.err)
	behind.decision.Release()
	assert.Equal(t, 0, f.queue.Held())
	assert.Equal(t, 0, f.active())
	assert.Equal(t, 1.0, f.outcomes(OutcomeFailed))
	assert.Equal(t, 1.0, f.outcomes(OutcomeDispatched))
}

// TestAtAFullQueue: max_queued 1, one request held. A newcomer that a held request
// goes before is refused at once; one of a higher priority than every held request is
// tried first, as it would be with nothing held: routed when a worker can take it
// (here the held request is a sheddable one waiting for the fleet's saturation to
// end, which a request of priority 0 or more does not wait for), refused when none
// can.
func TestAtAFullQueue(t *testing.T) {
	for _, tc := range []struct {
		name           string
		workerFull     bool
		held, newcomer string // objectives: "high" 5, "" 0, "low" -1 (sheddable)
		wantErr        error
	}{
		{"a newcomer of the held request's priority is refused", true, "", "", ErrQueueFull},
		{"a newcomer above a sheddable request is routed when a worker can take it", false, "low", "", nil},
		{"a newcomer above every held request is refused when no worker can take it", true, "", "high", ErrQueueFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxQueued = 1
			f := newFleet(t, cfg, nil)
			var holder *router.Decision
			if tc.workerFull {
				var err error
				holder, err = f.queue.Route(context.Background(), request("holder", "", ""))
				require.NoError(t, err)
			}
			waiter := f.start(t, "held", request("held", tc.held, ""), 1)

			d, err := f.queue.Route(context.Background(), request("newcomer", tc.newcomer, ""))
			if tc.wantErr != nil {
				assert.ErrorIs(t, err, tc.wantErr)
				assert.Equal(t, 1.0, f.outcomes(OutcomeQueueFull))
			} else {
				require.NoError(t, err)
				assert.Equal(t, "w0", d.Worker)
				d.Release()
			}
			if holder != nil {
				holder.Release()
			}
			if tc.held == "low" {
				f.timeouts <- time.Now()
			}
			waiter.wait(t)
			if waiter.decision != nil {
				waiter.decision.Release()
			}
			assert.Equal(t, 0, f.queue.Held())
			assert.Equal(t, 0, f.active())
		})
	}
}

// TestCloseAnswersTheHeldRequestsAndHoldsNoMore: as kvroute starts to drain, a held
// request gets ErrShuttingDown at once (another replica can take it), and a request
// refused for capacity afterwards gets the router's answer, as without flow control.
func TestCloseAnswersTheHeldRequestsAndHoldsNoMore(t *testing.T) {
	f := newFleet(t, DefaultConfig(), nil)
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	waiter := f.start(t, "waiter", request("waiter", "", ""), 1)
	f.queue.Close()
	waiter.wait(t)
	assert.ErrorIs(t, waiter.err, ErrShuttingDown)
	assert.Equal(t, 0, f.queue.Held())
	assert.Equal(t, 1.0, f.outcomes(OutcomeShutdown))
	_, err = f.queue.Route(context.Background(), request("after", "", ""))
	assert.ErrorIs(t, err, router.ErrOverloaded)
	assert.Equal(t, 0, f.queue.Held())
	f.queue.Close() // twice is harmless
	holder.Release()
	assert.Equal(t, 0, f.active())
}

// TestARequestOnlyABusyWorkerCanTakeDoesNotHoldBackItsModel: a request narrowed to one
// worker (a GIE subset hint, a stored response's worker) waits for it in a queue of its
// own; a request of the same model that any worker can take is routed at once to the
// idle one, not held behind it.
func TestARequestOnlyABusyWorkerCanTakeDoesNotHoldBackItsModel(t *testing.T) {
	for _, narrow := range []struct {
		name string
		set  func(*router.Request)
	}{
		{"a subset hint", func(r *router.Request) { r.Subset = []string{"127.0.0.1:1"} }},
		{"another subset hint", func(r *router.Request) { r.Subset = []string{"127.0.0.1:1", "127.0.0.1:3"} }},
	} {
		t.Run(narrow.name, func(t *testing.T) {
			f := newFleetOf(t, 2, DefaultConfig(), nil)
			busy := request("busy", "", "")
			narrow.set(busy)
			holder, err := f.queue.Route(context.Background(), busy)
			require.NoError(t, err)
			require.Equal(t, "w0", holder.Worker)
			pinned := request("pinned", "", "")
			narrow.set(pinned)
			waiter := f.start(t, "pinned", pinned, 1)

			var free *router.Decision
			routed := make(chan error, 1)
			go func() {
				var err error
				free, err = f.queue.Route(context.Background(), request("free", "", ""))
				routed <- err
			}()
			select {
			case err := <-routed:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				f.timeouts <- time.Now() // let it go (it was held behind the narrowed one)
				t.Fatal("held behind a request only the busy worker can take")
			}
			assert.Equal(t, "w1", free.Worker)
			assert.Equal(t, 1, f.queue.Held(), "the narrowed one still waits for w0")
			free.Release()
			holder.Release()
			waiter.wait(t)
			require.NoError(t, waiter.err)
			assert.Equal(t, "w0", waiter.decision.Worker)
			waiter.decision.Release()
		})
	}
}

// TestAHeldSessionWaitsForTheWorkerHoldingItsPrompt: every worker is full when a
// session's next turn comes; the other worker frees first. Without holder_wait the turn
// goes there (the session moves and its prompt is computed again); with it, the turn
// waits for its own worker, for at most holder_wait, then takes the free one.
func TestAHeldSessionWaitsForTheWorkerHoldingItsPrompt(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	for _, tc := range []struct {
		name       string
		holderWait time.Duration
		// patienceOver: holder_wait passes before the session's worker frees.
		patienceOver bool
		wantHolder   bool
		// next is the held request's prompt (the session's next turn when empty).
		next string
	}{
		{"off: the first worker that frees takes it", 0, false, false, ""},
		{"on: it waits for the worker holding its prompt", time.Second, false, true, ""},
		{"on, past holder_wait: the free worker takes it", time.Second, true, false, ""},
		{"on, a short prefix shared: the free worker takes it", time.Second, false, false,
			prompt[:40] + strings.Repeat("another request that only begins alike ", 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.HolderWait = tc.holderWait
			f := newFleetOf(t, 2, cfg, nil)
			first, err := f.queue.Route(context.Background(), request(prompt, "", ""))
			require.NoError(t, err)
			other, err := f.queue.Route(context.Background(), request("another session", "", ""))
			require.NoError(t, err)
			require.NotEqual(t, first.Worker, other.Worker)

			nextPrompt := tc.next
			if nextPrompt == "" {
				nextPrompt = prompt + "and its answer, and a second turn"
			}
			next := f.start(t, "next turn", request(nextPrompt, "", ""), 1)
			require.True(t, other.Release(), "the other worker frees first")
			if tc.patienceOver {
				f.clock.Advance(2 * time.Second)
			}
			if tc.wantHolder {
				select {
				case <-next.done:
					t.Fatalf("went to %s while its worker was busy", next.decision.Worker)
				case <-time.After(3 * RetryInterval):
				}
				require.True(t, first.Release())
			}
			next.wait(t)
			require.NoError(t, next.err)
			if tc.wantHolder {
				assert.Equal(t, first.Worker, next.decision.Worker)
			} else {
				assert.Equal(t, other.Worker, next.decision.Worker)
				first.Release()
			}
			next.decision.Release()
			assert.Equal(t, 0, f.queue.Held())
		})
	}
}

// TestAFreedSlotGoesByPriorityThenArrivalWhicheverQueueItsRequestWaitsIn: with
// holder_wait, a session's turn waiting for its worker and a request any worker may
// take wait in two queues of one model; the slot that worker frees goes to the higher
// priority of the two, or to the older at one priority, and the other gets the next.
func TestAFreedSlotGoesByPriorityThenArrivalWhicheverQueueItsRequestWaitsIn(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	for _, tc := range []struct {
		name                     string
		turnObjective, objective string
		wantTurnFirst            bool
	}{
		{"the other request's priority is higher: it goes first", "", "high", false},
		{"the turn's priority is higher: it goes first", "high", "", true},
		{"one priority: the turn, older, goes first", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.HolderWait = time.Minute
			f := newFleetOf(t, 2, cfg, nil)
			f.noRetries = true
			first, err := f.queue.Route(context.Background(), request(prompt, "", ""))
			require.NoError(t, err)
			busy, err := f.queue.Route(context.Background(), request("another session", "", ""))
			require.NoError(t, err)

			turn := f.start(t, "the session's turn", request(prompt+"and its answer, and a second turn", tc.turnObjective, ""), 1)
			other := f.start(t, "a request for any worker", request("an unrelated request", tc.objective, ""), 2)
			// Freed while the dispatcher tries a head, the slot would go to that head.
			f.settled(t)
			require.True(t, first.Release(), "the session's worker frees one slot")
			winner, loser := other, turn
			if tc.wantTurnFirst {
				winner, loser = turn, other
			}
			winner.wait(t)
			require.NoError(t, winner.err)
			assert.Equal(t, first.Worker, winner.decision.Worker)
			select {
			case <-loser.done:
				t.Fatalf("%s was routed too, to %s", loser.name, loser.decision.Worker)
			case <-time.After(3 * RetryInterval):
			}
			assert.Equal(t, 1, f.queue.Held())

			require.True(t, winner.decision.Release())
			loser.wait(t)
			require.NoError(t, loser.err)
			assert.Equal(t, first.Worker, loser.decision.Worker, "the slot freed again")
			loser.decision.Release()
			busy.Release()
			assert.Equal(t, 0, f.queue.Held())
		})
	}
}

// TestATurnWaitingForABusyWorkerIsNotRoutedUntilItHasRoom: a turn waiting for its
// session's worker (holder_wait) is not routed again while that worker stays full,
// however often the bookings change elsewhere (each try would be a whole decision:
// render, encode, look up), and is routed there once it frees.
func TestATurnWaitingForABusyWorkerIsNotRoutedUntilItHasRoom(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	turnPrompt := prompt + "and its answer, and a second turn"
	var mu sync.Mutex
	tries := 0
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute
	f := newFleetOf(t, 2, cfg, func(r *router.Router) Router {
		return routerFunc{Router: r, route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			if req.Prompt == turnPrompt {
				mu.Lock()
				tries++
				mu.Unlock()
			}
			return r.Route(ctx, req)
		}}
	})
	triesSoFar := func() int { mu.Lock(); defer mu.Unlock(); return tries }
	first, err := f.queue.Route(context.Background(), request(prompt, "", ""))
	require.NoError(t, err)
	busy, err := f.queue.Route(context.Background(), request("another session", "", ""))
	require.NoError(t, err)

	turn := f.start(t, "the session's turn", request(turnPrompt, "", ""), 1)
	require.Equal(t, 1, triesSoFar(), "tried once, as it came")
	// The other worker frees and fills, again and again: the ledger moves each time.
	busy.Release()
	for i := range 5 {
		d, err := f.queue.Route(context.Background(), request(fmt.Sprintf("request %d elsewhere", i), "", ""))
		require.NoError(t, err)
		require.Equal(t, busy.Worker, d.Worker)
		time.Sleep(2 * PollInterval)
		d.Release()
		time.Sleep(2 * PollInterval)
	}
	assert.Equal(t, 1, triesSoFar(), "not routed while its worker was full")

	require.True(t, first.Release())
	turn.wait(t)
	require.NoError(t, turn.err)
	assert.Equal(t, first.Worker, turn.decision.Worker)
	assert.Equal(t, 2, triesSoFar(), "routed once its worker had room")
	turn.decision.Release()
}

// TestATurnWaitingForAWorkerThatLeftTheFleetGoesToAFreeOne: a turn waiting for its
// session's worker (holder_wait) whose worker leaves the fleet while still booked full
// (its requests run on until they end) is no longer skipped as waiting for a worker
// without room: a decision would not wait for a worker out of the fleet, and the other
// worker, once free, takes it well before holder_wait.
func TestATurnWaitingForAWorkerThatLeftTheFleetGoesToAFreeOne(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	f := newFleetOf(t, 2, cfg, nil)
	first, err := f.queue.Route(context.Background(), request(prompt, "", ""))
	require.NoError(t, err)
	other, err := f.queue.Route(context.Background(), request("another session", "", ""))
	require.NoError(t, err)
	turn := f.start(t, "the session's turn", request(prompt+"and its answer, and a second turn", "", ""), 1)

	var stay []router.Worker
	for _, w := range f.router.Workers() {
		if w.Name != first.Worker {
			stay = append(stay, w)
		}
	}
	require.NoError(t, f.router.SetWorkers(stay), "the session's worker leaves, its request still running")
	require.True(t, other.Release(), "the worker left frees")
	f.servedOrFail(t, turn, "the turn waited on for a worker no longer in the fleet")
	require.NoError(t, turn.err)
	assert.Equal(t, other.Worker, turn.decision.Worker)
	turn.decision.Release()
	first.Release()
	assert.Equal(t, 0, f.queue.Held())
}

// TestANewcomerDoesNotJumpAHeldTurnThatMayTakeAnyWorker: a session's turn waits in its
// worker's queue (holder_wait) and its wait ends while every worker is still full:
// any worker may take it now. A worker frees and a newcomer of its priority comes
// before the dispatcher has looked: the newcomer joins the held requests rather than
// take the slot at once, and the turn, older, gets it.
func TestANewcomerDoesNotJumpAHeldTurnThatMayTakeAnyWorker(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	cfg := DefaultConfig()
	cfg.HolderWait = time.Second
	f := newFleetOf(t, 2, cfg, nil)
	// The dispatcher looks only when kicked: no poll, no retry interval.
	never := make(chan time.Time)
	cfg.Enabled = true
	q, err := New(cfg, Deps{Router: f.router, Ledger: f.bookings, Now: f.clock.Now, After: func(d time.Duration) <-chan time.Time {
		if d == cfg.MaxWait {
			return f.timeouts
		}
		return never
	}})
	require.NoError(t, err)
	f.queue = q
	first, err := q.Route(context.Background(), request(prompt, "", ""))
	require.NoError(t, err)
	busy, err := q.Route(context.Background(), request("another session", "", ""))
	require.NoError(t, err)
	turn := f.start(t, "the session's turn", request(prompt+"and its answer, and a second turn", "", ""), 1)
	time.Sleep(50 * time.Millisecond) // the dispatcher has looked and sleeps
	f.clock.Advance(2 * time.Second)  // the turn's holder_wait is over
	require.True(t, busy.Release())

	newcomer := f.start(t, "a newcomer", request("a newcomer", "", ""), 1)
	select {
	case <-newcomer.done:
		if newcomer.err == nil {
			newcomer.decision.Release()
		}
		f.timeouts <- time.Now()
		turn.wait(t)
		t.Fatalf("the newcomer jumped the held turn: %v %v", newcomer.err, newcomer.decision)
	case <-turn.done:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was routed")
	}
	require.NoError(t, turn.err)
	assert.Equal(t, busy.Worker, turn.decision.Worker)
	assert.Equal(t, 1, q.Held(), "the newcomer waits")
	f.timeouts <- time.Now()
	newcomer.wait(t)
	turn.decision.Release()
	first.Release()
}

// TestAfterCloseHoldOnSaturationRefusesNothing: once flow control is closed (draining)
// a request gets the router's answer as without flow control: with hold_on_saturation
// a request of priority 0 is not refused (429) for a saturated fleet, which without flow
// control it would be served on.
func TestAfterCloseHoldOnSaturationRefusesNothing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HoldOnSaturation = true
	f := newFleet(t, cfg, func(r *router.Router) Router {
		return routerFunc{Router: r, route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			if req.HoldOnSaturation { // every engine saturated
				return nil, router.ErrSaturated
			}
			return r.Route(ctx, req)
		}}
	})
	f.queue.Close()
	d, err := f.queue.Route(context.Background(), request("after", "", ""))
	require.NoError(t, err)
	d.Release()
	assert.Equal(t, 0, f.active())
}

// TestWhileDrainingATurnDoesNotWaitForItsBusyWorker: once flow control is closed
// (kvroute drains), a request is routed as without it: with holder_wait, a session's
// turn whose worker is full goes to the worker with room rather than get a 429 naming
// its busy holder.
func TestWhileDrainingATurnDoesNotWaitForItsBusyWorker(t *testing.T) {
	prompt := strings.Repeat("a long system prompt and a first turn ", 20)
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute
	f := newFleetOf(t, 2, cfg, nil)
	first, err := f.queue.Route(context.Background(), request(prompt, "", ""))
	require.NoError(t, err)
	f.queue.Close()
	d, err := f.queue.Route(context.Background(), request(prompt+"and its answer, and a second turn", "", ""))
	require.NoError(t, err, "no 429 for a busy holder while another worker has room")
	assert.NotEqual(t, first.Worker, d.Worker)
	d.Release()
	first.Release()
}
