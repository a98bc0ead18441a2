package flowcontrol

import (
	"context"
	"errors"
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
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// recorder is a real router behind flow control that records, in one sequence, when
// each request joined its queue (flow control asks its priority then, under the
// queue's lock, and last) and when each routing the dispatchers made began and ended,
// to check the order the queues let requests go in.
type recorder struct {
	*router.Router
	queue *Queue

	mu  sync.Mutex
	seq int
	// enqueued is the sequence number of the last time flow control asked req's
	// priority: its joining its queue, for a request that joined one (it may ask
	// before, to see whether a held request goes before req).
	enqueued map[*router.Request]int
	// lastExit is, per model, the end of its dispatcher's last routing.
	lastExit   map[string]int
	dispatched []dispatched // the decisions the dispatchers made, in order
	// direct and directFailed count the routings made at once, before any queue, that
	// gave a decision or another error than a refusal for capacity.
	direct, directFailed int
	// waitedForHolder counts the refusals naming a busy holder (holder_wait).
	waitedForHolder int
}

type dispatched struct {
	req *router.Request
	// entry is when its routing began; before is when the dispatcher's previous routing
	// ended: the dispatcher chose it as its queue's head in between.
	entry, before int
	// exit is when its routing ended (it left the queue after).
	exit int
}

func (rec *recorder) Priority(req *router.Request) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.seq++
	rec.enqueued[req] = rec.seq
	return rec.Router.Priority(req)
}

// routing reports whether a dispatcher routes req (it is a queue's head, being
// routed): a routing of req's first, at once, is not.
func routing(q *Queue, req *router.Request) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	g := q.groups[req.Model]
	if g == nil {
		return false
	}
	for _, mq := range g.queues {
		for _, b := range mq.bands {
			for fe := b.flows.Front(); fe != nil; fe = fe.Next() {
				for we := fe.Value.(*flow).waiters.Front(); we != nil; we = we.Next() {
					if w := we.Value.(*waiter); w.req == req {
						return w.state == stateRouting
					}
				}
			}
		}
	}
	return false
}

func (rec *recorder) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	byDispatcher := routing(rec.queue, req)
	rec.mu.Lock()
	rec.seq++
	entry, before := rec.seq, rec.lastExit[req.Model]
	rec.mu.Unlock()

	d, err := rec.Router.Route(ctx, req)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.seq++
	var busy *router.HolderBusyError
	if errors.As(err, &busy) {
		rec.waitedForHolder++
	}
	switch {
	case byDispatcher:
		rec.lastExit[req.Model] = rec.seq
		if d != nil {
			rec.dispatched = append(rec.dispatched, dispatched{req: req, entry: entry, before: before, exit: rec.seq})
		}
	case d != nil:
		rec.direct++
	case !held(err):
		rec.directFailed++
	}
	return d, err
}

// stressCall is one request of the stress test and what became of it.
type stressCall struct {
	req       *router.Request
	delay     time.Duration // before it is sent
	hold      time.Duration // how long its client keeps the worker once routed
	cancelAt  time.Duration // when its client goes away; 0: never
	cancelled bool          // its context had ended when Route returned
	decision  *router.Decision
	err       error
}

// TestStressHeldRequestsAllEndAndGoInOrder drives hundreds of requests of random
// models, priorities and fairness ids through flow control in front of a real router
// whose workers take two requests each, with random cancels, random max_wait timeouts
// and random generation lengths, and checks at the end that every request got an
// answer, that nothing stays held, booked or dispatching, that the metrics count each
// queued request once, and that each queue let its requests go by priority, then its
// fairness ids' turns, then arrival.
func TestStressHeldRequestsAllEndAndGoInOrder(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) { stress(t, seed, 300, 0) })
	}
}

// TestStressWithHolderWaitEveryRequestEnds is the stress test with holder_wait, the
// requests turns of a few sessions (long shared prompts), so that some wait in their
// session's worker's queue, move there and back to the model's queue as their wait
// ends: every request gets an answer and nothing stays held, booked or dispatching.
// The order is not checked: a request waiting for one worker may rightly see others
// of a lower priority go to the others.
func TestStressWithHolderWaitEveryRequestEnds(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) { stress(t, seed, 300, 2*time.Millisecond) })
	}
}

func stress(t *testing.T, seed uint64, n int, holderWait time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	workers := []router.Worker{
		{Name: "w0", Address: "127.0.0.1:1", Models: []string{"m"}},
		{Name: "w1", Address: "127.0.0.1:2", Models: []string{"m", "n"}},
		{Name: "w2", Address: "127.0.0.1:3", Models: []string{"n"}},
	}
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(seed, 1)))
	require.NoError(t, err)
	bookings := scoring.NewBookings()
	r, err := router.New(router.Config{BlockSize: 4, MaxActiveRequestsPerWorker: 2, Workers: workers},
		router.Deps{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker,
			// With holder_wait a session's worker holds its turns' prefix.
			RecordBlocks: holderWait > 0,
			// "low" is sheddable, and with no engine metrics the fleet is saturated for it:
			// it is held until its max_wait fires or its client leaves.
			Objectives: priority.NewObjectives(map[string]int{"high": 5, "mid": 2, "low": -1})})
	require.NoError(t, err)
	rec := &recorder{Router: r, enqueued: map[*router.Request]int{}, lastExit: map[string]int{}}

	cfg := DefaultConfig()
	cfg.Enabled, cfg.MaxQueued, cfg.HolderWait = true, 24, holderWait
	// max_wait fires when the test says: a tick on timeouts ends the wait of one of the
	// requests waiting then.
	timeouts := make(chan time.Time)
	registry := prometheus.NewRegistry()
	q, err := New(cfg, Deps{Router: rec, Ledger: bookings, Metrics: NewMetrics(registry),
		After: func(d time.Duration) <-chan time.Time {
			if d == cfg.MaxWait {
				return timeouts
			}
			return time.After(d)
		}})
	require.NoError(t, err)
	rec.queue = q

	prompt := func(i int) string { return fmt.Sprintf("request %d", i) }
	if holderWait > 0 {
		// Turns of eight sessions, each session's turns sharing a long prefix.
		prompt = func(i int) string {
			return strings.Repeat(fmt.Sprintf("session %d says ", i%8), 12) + fmt.Sprintf("turn %d", i)
		}
	}
	objectives := []string{"", "", "", "", "high", "mid", "mid", "low"}
	fairness := []string{"", "t1", "t1", "t2", "t3", "t4"}
	calls := make([]*stressCall, n)
	for i := range calls {
		c := &stressCall{
			req: &router.Request{Model: []string{"m", "n"}[rng.IntN(2)], Prompt: prompt(i),
				Objective: objectives[rng.IntN(len(objectives))], FairnessID: fairness[rng.IntN(len(fairness))]},
			// Arrivals spread over about n × 150 µs, faster than the workers free.
			delay: time.Duration(i*150+rng.IntN(3000)) * time.Microsecond,
			hold:  time.Duration(rng.IntN(1500)) * time.Microsecond,
		}
		if rng.IntN(6) == 0 {
			c.cancelAt = time.Duration(1+rng.IntN(3000)) * time.Microsecond
		}
		calls[i] = c
	}

	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			time.Sleep(c.delay)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancelAt > 0 {
				stop := time.AfterFunc(c.cancelAt, cancel)
				defer stop.Stop()
			}
			c.decision, c.err = q.Route(ctx, c.req)
			c.cancelled = ctx.Err() != nil
			if c.decision != nil {
				// The generation: its booking goes at its end, as the filter's stream
				// releases it.
				time.Sleep(c.hold)
				c.decision.Release()
			}
		})
	}
	// max_wait passes now and then for whichever request waits then, until every call
	// returned.
	allDone := make(chan struct{})
	ticks := rand.New(rand.NewPCG(seed, 2))
	go func() {
		for {
			select {
			case <-allDone:
				return
			case <-time.After(time.Duration(200+ticks.IntN(2000)) * time.Microsecond):
				select {
				case timeouts <- time.Now():
				default:
				}
			}
		}
	}()
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(2 * time.Minute):
		close(allDone)
		t.Fatalf("calls never returned; held %d", q.Held())
	}
	close(allDone)

	// Nothing is held, booked, or dispatching.
	assert.Equal(t, 0, q.Held())
	for _, w := range workers {
		assert.Zero(t, bookings.Load(w.Name).ActiveRequests, "requests still booked on %s", w.Name)
	}
	require.Eventually(t, func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.groups) == 0
	}, 10*time.Second, time.Millisecond, "a dispatcher outlived its queue")

	// Each call ended as it may.
	var routed, queueFull, cancels int
	for i, c := range calls {
		switch {
		case c.err == nil:
			require.NotNil(t, c.decision, "call %d", i)
			routed++
		case errors.Is(c.err, ErrQueueFull):
			queueFull++
		case errors.Is(c.err, ErrTimedOut):
		case errors.Is(c.err, context.Canceled):
			assert.True(t, c.cancelled, "call %d got its context's error while its context lived", i)
			cancels++
		default:
			t.Errorf("call %d: unexpected error %v", i, c.err)
		}
		if c.err != nil {
			assert.Nil(t, c.decision, "call %d: a decision with an error", i)
		}
	}

	// The metrics count each request queued once, by its outcome.
	outcome := func(o string) int { return int(testutil.ToFloat64(q.deps.Metrics.outcomes.WithLabelValues(o))) }
	// Every call not answered at once (routed, failed or refused at a full queue) was
	// queued.
	queued := n - rec.direct - rec.directFailed - queueFull
	assert.Equal(t, queued, outcome(OutcomeDispatched)+outcome(OutcomeTimedOut)+outcome(OutcomeCancelled)+outcome(OutcomeFailed),
		"the outcomes of the %d requests queued", queued)
	assert.Zero(t, outcome(OutcomeFailed), "no routing failed but for capacity")
	assert.Equal(t, queueFull, outcome(OutcomeQueueFull))
	assert.Equal(t, routed, rec.direct+outcome(OutcomeDispatched), "the requests routed: at once, or dispatched")
	assert.Zero(t, testutil.ToFloat64(q.deps.Metrics.held), "the gauge of held requests")
	assert.Equal(t, queued, waitedSamples(t, registry), "every queued request's wait observed")
	t.Logf("seed %d: %d calls, %d queued, %d routed (%d dispatched), %d queue full, %d timed out, %d cancelled",
		seed, n, queued, routed, outcome(OutcomeDispatched), queueFull, outcome(OutcomeTimedOut), cancels)

	if holderWait > 0 {
		t.Logf("seed %d: %d held waiting for their holder", seed, rec.waitedForHolder)
		assert.Positive(t, rec.waitedForHolder, "no request waited for its holder: the test tests nothing of it")
		return
	}
	checkOrder(t, rec)
}

// waitedSamples is the number of waits observed, over every outcome.
func waitedSamples(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	total := 0
	for _, f := range families {
		if f.GetName() == "kvroute_flow_control_wait_seconds" {
			for _, m := range f.GetMetric() {
				total += int(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

// checkOrder checks each decision X a dispatcher made against the requests queued
// when it chose X, at some point between the end of its previous routing (X.before)
// and the start of X's. A request Y of X's model queued before X.before and dispatched
// after X was in the queue then (only the dispatcher takes out a request it
// dispatches). So Y may not have a higher priority than X, nor be older in X's flow;
// and when X's flow also had its band's previous dispatch, Y's flow (of X's band,
// another fairness id, queued since before that dispatch left) had to have its turn in
// between.
func checkOrder(t *testing.T, rec *recorder) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	prio := rec.Router.Priority
	// last is, per model and priority, the band's last dispatched request.
	last := map[string]dispatched{}
	violations, checked := 0, 0
	defer func() { t.Logf("%d decisions, %d pairs checked", len(rec.dispatched), checked) }()
	for i, x := range rec.dispatched {
		band := fmt.Sprintf("%s/%d", x.req.Model, prio(x.req))
		previous, hasPrevious := last[band]
		last[band] = x
		for _, y := range rec.dispatched[i+1:] {
			if y.req.Model != x.req.Model || rec.enqueued[y.req] >= x.before {
				continue
			}
			checked++
			switch {
			case prio(y.req) > prio(x.req):
				t.Errorf("%q (priority %d) went before %q (priority %d), queued since before", x.req.Prompt, prio(x.req), y.req.Prompt, prio(y.req))
				violations++
			case prio(y.req) == prio(x.req) && y.req.FairnessID == x.req.FairnessID && rec.enqueued[y.req] < rec.enqueued[x.req]:
				t.Errorf("%q went before %q of its flow %q, queued before it", x.req.Prompt, y.req.Prompt, x.req.FairnessID)
				violations++
			case hasPrevious && prio(y.req) == prio(x.req) && previous.req.FairnessID == x.req.FairnessID &&
				y.req.FairnessID != x.req.FairnessID && rec.enqueued[y.req] < previous.exit:
				t.Errorf("flow %q went twice in a row (%q, %q) while %q of flow %q waited", x.req.FairnessID, previous.req.Prompt, x.req.Prompt, y.req.Prompt, y.req.FairnessID)
				violations++
			}
			if violations > 10 {
				t.FailNow()
			}
		}
	}
}
