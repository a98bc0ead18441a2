package flowcontrol

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// Tests of the queues of the requests waiting for a busy worker (holder_wait).

// hooked is a real router with hooks in place of some of its methods; a nil hook is
// the router's own.
type hooked struct {
	*router.Router
	route      func(ctx context.Context, req *router.Request) (*router.Decision, error)
	hasRoom    func(worker string) bool
	stillWaits func(busy *router.HolderBusyError) bool
}

func (h hooked) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	if h.route != nil {
		return h.route(ctx, req)
	}
	return h.Router.Route(ctx, req)
}

func (h hooked) HasRoom(worker string) bool {
	if h.hasRoom != nil {
		return h.hasRoom(worker)
	}
	return h.Router.HasRoom(worker)
}

func (h hooked) StillWaits(busy *router.HolderBusyError) bool {
	if h.stillWaits != nil {
		return h.stillWaits(busy)
	}
	return h.Router.StillWaits(busy)
}

// sessionPrompt is a session's prompt so far, long enough that its worker holds more
// than half of its next turn (turnPrompt), which waits for that worker (holder_wait).
var (
	sessionPrompt = strings.Repeat("a long system prompt and a first turn ", 20)
	turnPrompt    = sessionPrompt + "and its answer, and a second turn"
)

// copyTo is the session's prompt so far pinned to the worker at address (a GIE
// subset hint): routed, that worker holds it too.
func copyTo(address string) *router.Request {
	req := request(sessionPrompt, "", "")
	req.Subset = []string{address}
	return req
}

// withRetries replaces f's queue with one of cfg in front of r whose retry intervals
// pass when the test sends on retry (the dispatcher takes each send).
func (f *fleet) withRetries(t *testing.T, cfg Config, r Router) (q *Queue, retry chan<- time.Time) {
	return f.withRetriesOn(t, cfg, r, f.bookings)
}

// withRetriesOn is withRetries with ledger's version waking the heads.
func (f *fleet) withRetriesOn(t *testing.T, cfg Config, r Router, ledger Ledger) (q *Queue, retry chan<- time.Time) {
	t.Helper()
	ch := make(chan time.Time)
	cfg.Enabled = true
	q, err := New(cfg, Deps{Router: r, Ledger: ledger, Panics: f.panics, Now: f.clock.Now, After: func(d time.Duration) <-chan time.Time {
		switch d {
		case cfg.MaxWait:
			return f.timeouts
		case RetryInterval:
			return ch
		}
		return time.After(d)
	}})
	require.NoError(t, err)
	f.queue = q
	return q, ch
}

// countingTurnTries is f's router, counting in tries the decisions made for the turn
// (turnPrompt), with stillWaits for its StillWaits.
func (f *fleet) countingTurnTries(tries *atomic.Int32, stillWaits func(*router.HolderBusyError) bool) hooked {
	return hooked{Router: f.router,
		route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			if req.Prompt == turnPrompt {
				tries.Add(1)
			}
			return f.router.Route(ctx, req)
		},
		stillWaits: stillWaits}
}

// turnWaitingForItsWorker fills f's two workers through q, one with the session
// (sessionPrompt), the other with another, and starts the session's turn, which waits
// for its worker (held).
func (f *fleet) turnWaitingForItsWorker(t *testing.T, q *Queue) (first, other *router.Decision, turn *call) {
	t.Helper()
	first, err := q.Route(context.Background(), request(sessionPrompt, "", ""))
	require.NoError(t, err)
	other, err = q.Route(context.Background(), request("another session", "", ""))
	require.NoError(t, err)
	return first, other, f.start(t, "the session's turn", request(turnPrompt, "", ""), 1)
}

// awaitRequeued waits until the dispatchers route nothing (a head they tried is back
// in its queue, or gone).
func (f *fleet) awaitRequeued(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		f.queue.mu.Lock()
		defer f.queue.mu.Unlock()
		for _, g := range f.queue.groups {
			for _, mq := range g.queues {
				if h := mq.head(); h != nil && h.state == stateRouting {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the dispatchers requeue what they tried")
}

// TestATurnRefusedWithoutAHolderWaitsForAnyWorker: a session's turn waits in its
// worker's queue (holder_wait, which the fake clock never reaches). Tried while that
// worker seems to have room (it frees and fills again meanwhile), it is refused for
// another reason than a busy holder: every worker full, the other one holding its
// prompt as well by now; or the fleet saturated for it. It then waits for any worker,
// so the other worker, once free, takes it, rather than wait on in its worker's queue,
// passed over while that worker is full, until holder_wait. It keeps its place by
// arrival there: a request that came after it and waits for any worker goes after it.
func TestATurnRefusedWithoutAHolderWaitsForAnyWorker(t *testing.T) {
	for _, tc := range []struct {
		name string
		// refusal is what the turn's second decision gives in place of the router's;
		// nil: the router's (ErrOverloaded, no holder).
		refusal error
	}{
		{"every worker full, none holding the most", nil},
		{"the fleet saturated for it", router.ErrSaturated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tries atomic.Int32
			var roomOnce atomic.Bool
			cfg := DefaultConfig()
			cfg.HolderWait = time.Minute
			f := newFleetOf(t, 2, cfg, func(r *router.Router) Router {
				return hooked{Router: r,
					route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
						if req.Prompt == turnPrompt && tries.Add(1) == 2 && tc.refusal != nil {
							return nil, tc.refusal
						}
						return r.Route(ctx, req)
					},
					hasRoom: func(worker string) bool {
						return roomOnce.CompareAndSwap(true, false) || r.HasRoom(worker)
					}}
			})
			f.noRetries = true
			ctx := context.Background()
			first, err := f.queue.Route(ctx, request(sessionPrompt, "", ""))
			require.NoError(t, err)
			other, err := f.queue.Route(ctx, request("another session", "", ""))
			require.NoError(t, err)
			turn := f.start(t, "the session's turn", request(turnPrompt, "", ""), 1)
			require.Equal(t, int32(1), tries.Load(), "it waits for its worker")

			// The other worker comes to hold the prompt too: a copy of it goes there.
			require.True(t, other.Release())
			other, err = f.queue.Route(ctx, copyTo(other.Address))
			require.NoError(t, err)
			require.NotEqual(t, first.Worker, other.Worker)

			later := f.start(t, "a later request", request("a later request", "", ""), 2)

			roomOnce.Store(true) // the session's worker frees and fills again
			require.Eventually(t, func() bool { return tries.Load() == 2 }, 10*time.Second, time.Millisecond, "tried again")
			f.awaitRequeued(t)
			require.Equal(t, 2, f.queue.Held(), "refused again")

			require.True(t, other.Release())
			select {
			case <-turn.done:
			case <-later.done:
				t.Fatal("the later request went first: the turn waited on for its worker, or behind the later one")
			case <-time.After(10 * time.Second):
				t.Fatal("the freed worker took neither")
			}
			require.NoError(t, turn.err)
			assert.Equal(t, other.Worker, turn.decision.Worker, "the turn, older, goes first")
			require.True(t, first.Release())
			later.wait(t)
			require.NoError(t, later.err)
			later.decision.Release()
			turn.decision.Release()
			assert.Equal(t, 0, f.queue.Held())
		})
	}
}

// TestATurnWaitingForAFullWorkerIsAskedOnceARetryWhetherItStillWaits: a session's turn
// waits for its worker (holder_wait), which stays full. It is not decided again as
// requests come and go elsewhere, and at each retry interval the router is asked,
// without a decision, whether it still waits for that worker. Once the other worker
// holds its prompt as well (a copy of it went there) and is free, the next retry
// interval finds it no longer waits, and the other worker takes it, before holder_wait
// ends.
func TestATurnWaitingForAFullWorkerIsAskedOnceARetryWhetherItStillWaits(t *testing.T) {
	var tries, asked atomic.Int32
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	f := newFleetOf(t, 2, cfg, nil)
	q, retry := f.withRetries(t, cfg, f.countingTurnTries(&tries, func(busy *router.HolderBusyError) bool {
		asked.Add(1)
		return f.router.StillWaits(busy)
	}))
	ctx := context.Background()
	first, other, turn := f.turnWaitingForItsWorker(t, q)

	retry <- time.Now()
	require.Eventually(t, func() bool { return asked.Load() == 1 }, 10*time.Second, time.Millisecond, "asked at a retry interval")
	// Requests come and go on the other worker (its ledger moves), and the other
	// worker comes to hold the turn's prompt too.
	require.True(t, other.Release())
	elsewhere, err := q.Route(ctx, request("a request elsewhere", "", ""))
	require.NoError(t, err)
	require.True(t, elsewhere.Release())
	other, err = q.Route(ctx, copyTo(other.Address))
	require.NoError(t, err)
	require.True(t, other.Release())
	f.awaitRequeued(t)
	assert.Equal(t, int32(1), tries.Load(), "decided once, as it came")
	assert.Equal(t, int32(1), asked.Load(), "asked only at the retry interval")

	retry <- time.Now()
	f.servedOrFail(t, turn, "the turn waited on for its worker, its prompt held by a free one")
	require.NoError(t, turn.err)
	assert.Equal(t, other.Worker, turn.decision.Worker)
	assert.Equal(t, int32(2), tries.Load(), "decided again once it no longer waited")
	assert.Equal(t, int32(2), asked.Load())
	turn.decision.Release()
	first.Release()
	assert.Equal(t, 0, q.Held())
}

// churning is a ledger whose version moves at every read: a busy fleet, whose
// bookings change between any two looks of a dispatcher.
type churning struct{ version atomic.Uint64 }

func (c *churning) Version() uint64 { return c.version.Add(1) }

// TestATurnWaitingForAFullWorkerIsAskedAtARetryWhileItsDispatcherIsBusy: a session's
// turn waits for its full worker (holder_wait) while another request of its model,
// which the router refuses at every try (the fleet saturated for it), is tried again at
// each change of the bookings, which change all the time (a busy fleet): the
// dispatcher never runs out of heads to try. A retry interval passing still counts:
// the turn is asked, once, whether it still waits for its worker, rather than only
// once the dispatcher has nothing left to try (never, while the fleet is busy).
func TestATurnWaitingForAFullWorkerIsAskedAtARetryWhileItsDispatcherIsBusy(t *testing.T) {
	var asked, spins atomic.Int32
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	cfg.Enabled = true
	f := newFleetOf(t, 2, cfg, nil)
	q, retry := f.withRetriesOn(t, cfg, hooked{Router: f.router,
		route: func(ctx context.Context, req *router.Request) (*router.Decision, error) {
			if req.Prompt == "refused at every try" {
				spins.Add(1)
				return nil, router.ErrSaturated
			}
			return f.router.Route(ctx, req)
		},
		stillWaits: func(busy *router.HolderBusyError) bool {
			asked.Add(1)
			return f.router.StillWaits(busy)
		}}, &churning{})
	first, other, turn := f.turnWaitingForItsWorker(t, q)
	refused := f.start(t, "a request refused at every try", request("refused at every try", "", ""), 2)
	require.Eventually(t, func() bool { return spins.Load() > 10 }, 10*time.Second, time.Millisecond, "tried at each change")
	require.Equal(t, int32(0), asked.Load())

	select {
	case retry <- time.Now():
	case <-time.After(10 * time.Second):
		t.Fatal("a retry interval passed uncounted: the dispatcher tries the refused request again and again")
	}
	require.Eventually(t, func() bool { return asked.Load() == 1 }, 10*time.Second, time.Millisecond, "asked at the retry interval")

	refused.cancel()
	refused.wait(t)
	require.ErrorIs(t, refused.err, context.Canceled)
	require.True(t, first.Release())
	turn.wait(t)
	require.NoError(t, turn.err)
	assert.Equal(t, first.Worker, turn.decision.Worker)
	assert.Equal(t, int32(1), asked.Load())
	turn.decision.Release()
	other.Release()
	assert.Equal(t, 0, heldWithin(t, q))
}

// TestAMovedRequestTakesItsPlaceByArrivalInItsFlow: a request moving between a group's
// queues joins its fairness id's waiters after those that came before it and before
// those that came after it, wherever that is: first, between two, or last.
func TestAMovedRequestTakesItsPlaceByArrivalInItsFlow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waiting []uint64
		moved   uint64
		want    []uint64
	}{
		{"into an empty flow", nil, 5, []uint64{5}},
		{"older than every one waiting", []uint64{7, 9}, 5, []uint64{5, 7, 9}},
		{"between two", []uint64{3, 9}, 5, []uint64{3, 5, 9}},
		{"among several younger ones", []uint64{1, 2, 6, 7, 8}, 5, []uint64{1, 2, 5, 6, 7, 8}},
		{"younger than every one waiting", []uint64{1, 3}, 5, []uint64{1, 3, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f flow
			for _, seq := range tc.waiting {
				f.waiters.PushBack(&waiter{seq: seq})
			}
			f.insert(&waiter{seq: tc.moved})
			var got []uint64
			for e := f.waiters.Front(); e != nil; e = e.Next() {
				got = append(got, e.Value.(*waiter).seq)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// backOffs is a health check whose workers are out for a back-off while marked so.
type backOffs struct {
	mu  sync.Mutex
	out map[string]bool
}

func (b *backOffs) Eligible(worker string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.out[worker]
}

func (b *backOffs) set(worker string, out bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.out == nil {
		b.out = map[string]bool{}
	}
	b.out[worker] = out
}

// retryUnlessServed lets a retry interval pass for turn's dispatcher, unless turn is
// served first: a worker leaving the candidates may free the turn at the ledger's move
// already (its worker then has room, for flow control), and a dispatcher left with
// nothing to try is gone and reads no retry (a bare send then blocked the test for
// good: seen once, under a loaded machine).
func retryUnlessServed(t *testing.T, retry chan<- time.Time, turn *call) {
	t.Helper()
	select {
	case retry <- time.Now():
	case <-turn.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no dispatcher took the retry interval, and the turn was not served")
	}
}

// TestATurnWaitingForAWorkerNoLongerACandidateIsDecidedAgain: a session's turn waits
// for its full worker (holder_wait, which the fake clock never reaches) when that
// worker stops being a candidate for it while still booked full (its requests run on):
// out for a health back-off, or a reload that leaves the model out of its models. A
// decision would not wait for it, so by the next retry interval the turn is decided
// again, and the other worker, free, takes it.
func TestATurnWaitingForAWorkerNoLongerACandidateIsDecidedAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, f *fleet, health *backOffs, holder string)
	}{
		{"out for a health back-off", func(_ *testing.T, _ *fleet, health *backOffs, holder string) {
			health.set(holder, true)
		}},
		{"its models no longer the turn's (a reload)", func(t *testing.T, f *fleet, _ *backOffs, holder string) {
			workers := f.router.Workers()
			at := slices.IndexFunc(workers, func(w router.Worker) bool { return w.Name == holder })
			workers[at].Models = []string{"another model"}
			require.NoError(t, f.router.SetWorkers(workers))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.HolderWait = time.Minute // the fake clock never gets there
			health := &backOffs{}
			f := newFleetWith(t, 2, cfg, nil, func(d *router.Deps) { d.Health = health })
			q, retry := f.withRetries(t, cfg, f.router)
			first, other, turn := f.turnWaitingForItsWorker(t, q)
			tc.leave(t, f, health, first.Worker)
			require.True(t, other.Release())
			f.awaitRequeued(t)

			retryUnlessServed(t, retry, turn)
			f.servedOrFail(t, turn, "the turn waited on for a worker no decision would wait for")
			require.NoError(t, turn.err)
			assert.Equal(t, other.Worker, turn.decision.Worker)
			turn.decision.Release()
			first.Release()
			assert.Equal(t, 0, q.Held())
		})
	}
}

// TestATurnWaitingForItsWorkerGoesToOneBackFromABackOffHoldingItsPrompt: a session's
// turn waits for its full worker (holder_wait, which the fake clock never reaches)
// while the one other worker holding its prompt is out for a health back-off (the
// third is full). That worker back, free, a decision would send the turn there: by
// the next retry interval the turn is decided again and goes there. (The health check
// is a fake that leaves the index alone; kvroute's own drops an out worker's entries,
// so this stands for blocks recorded or reported on the worker since it came back.)
func TestATurnWaitingForItsWorkerGoesToOneBackFromABackOffHoldingItsPrompt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	health := &backOffs{}
	f := newFleetWith(t, 3, cfg, nil, func(d *router.Deps) { d.Health = health })
	q, retry := f.withRetries(t, cfg, f.router)
	ctx := context.Background()
	workers := f.router.Workers()
	copied, err := q.Route(ctx, copyTo(workers[1].Address))
	require.NoError(t, err)
	require.True(t, copied.Release(), "w1 holds the session's prompt, free")
	first, err := q.Route(ctx, copyTo(workers[0].Address))
	require.NoError(t, err)
	another := request("another session", "", "")
	another.Subset = []string{workers[2].Address}
	other, err := q.Route(ctx, another)
	require.NoError(t, err)
	health.set("w1", true)
	turn := f.start(t, "the session's turn", request(turnPrompt, "", ""), 1)
	f.awaitRequeued(t)

	health.set("w1", false)
	retryUnlessServed(t, retry, turn)
	f.servedOrFail(t, turn, "the turn waited on for its worker, its prompt held by a free one back from a back-off")
	require.NoError(t, turn.err)
	assert.Equal(t, "w1", turn.decision.Worker)
	turn.decision.Release()
	first.Release()
	other.Release()
	assert.Equal(t, 0, q.Held())
}
