package flowcontrol

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/router"
)

// Tests of a collaborator's panic (a bug of the router's) where flow control calls it
// under its lock.

// heldWithin is q.Held(), or a failure if the queue's lock is not free within 10 s.
func heldWithin(t *testing.T, q *Queue) int {
	t.Helper()
	held := make(chan int, 1)
	go func() { held <- q.Held() }()
	select {
	case n := <-held:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("the queue's lock is still held")
		return 0
	}
}

// TestAPanickingHasRoomCountsAsRoom: the router's HasRoom panics while a session's
// turn waits for its busy worker (holder_wait). Asked under the queue's lock by the
// dispatcher, and by a newcomer looking for the requests held before it, its panic
// neither ends the process nor leaves the lock held: the worker counts as having room,
// so the turn gets whole decisions (which say it still waits, until its worker frees),
// the newcomer waits behind it, and each goes when a worker frees.
func TestAPanickingHasRoomCountsAsRoom(t *testing.T) {
	var armed atomic.Bool
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	f := newFleetOf(t, 2, cfg, func(r *router.Router) Router {
		return hooked{Router: r, hasRoom: func(worker string) bool {
			if armed.Load() {
				panic("injected fault")
			}
			return r.HasRoom(worker)
		}}
	})
	f.noRetries = true
	ctx := context.Background()
	first, err := f.queue.Route(ctx, request(sessionPrompt, "", ""))
	require.NoError(t, err)
	other, err := f.queue.Route(ctx, request("another session", "", ""))
	require.NoError(t, err)
	armed.Store(true)
	turn := f.start(t, "the session's turn", request(turnPrompt, "", ""), 1)

	later := &call{name: "a newcomer", done: make(chan struct{})}
	go func() {
		defer close(later.done)
		defer func() {
			if p := recover(); p != nil {
				later.err = fmt.Errorf("panicked: %v", p)
			}
		}()
		later.decision, later.err = f.queue.Route(ctx, request("a newcomer", "", ""))
	}()
	for deadline := time.Now().Add(10 * time.Second); heldWithin(t, f.queue) != 2; time.Sleep(time.Millisecond) {
		select {
		case <-later.done:
			t.Fatalf("the newcomer's Route returned: %v %v", later.decision, later.err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the newcomer is never held")
	}

	// Freed while the dispatcher tries a head, the slot would go to that head.
	f.settled(t)
	require.True(t, first.Release())
	turn.wait(t)
	require.NoError(t, turn.err)
	assert.Equal(t, first.Worker, turn.decision.Worker, "the turn, older, goes first, to its worker")
	require.True(t, other.Release())
	later.wait(t)
	require.NoError(t, later.err)
	assert.Equal(t, other.Worker, later.decision.Worker)
	turn.decision.Release()
	later.decision.Release()
	assert.Equal(t, 0, heldWithin(t, f.queue))
	assert.Positive(t, backgroundtest.Panics(t, f.registry, background.LoopFlowControl), "each panic is counted")
}

// TestAPanickingPriorityLeavesTheQueueUsable: the router's Priority panics for a
// request while another is held. The request's Route panics, on its own goroutine
// (the stream's server recovery fails that stream alone), as it would without flow
// control, and the queue's lock is free: the held request goes when the worker frees.
func TestAPanickingPriorityLeavesTheQueueUsable(t *testing.T) {
	f := newFleet(t, DefaultConfig(), func(r *router.Router) Router {
		return prioritized{Router: r, priority: func(req *router.Request) int {
			if req.Objective == "bomb" {
				panic("injected fault")
			}
			return r.Priority(req)
		}}
	})
	holder, err := f.queue.Route(context.Background(), request("holder", "", ""))
	require.NoError(t, err)
	waiter := f.start(t, "waiter", request("waiter", "", ""), 1)

	assert.PanicsWithValue(t, "injected fault", func() {
		_, _ = f.queue.Route(context.Background(), request("bomb", "bomb", ""))
	})
	assert.Equal(t, 1, heldWithin(t, f.queue))
	require.True(t, holder.Release())
	waiter.wait(t)
	require.NoError(t, waiter.err)
	waiter.decision.Release()
	assert.Equal(t, 0, heldWithin(t, f.queue))
}

// prioritized is a real router whose Priority is priority.
type prioritized struct {
	*router.Router
	priority func(req *router.Request) int
}

func (p prioritized) Priority(req *router.Request) int { return p.priority(req) }

// TestAPanickingStillWaitsCountsAsNo: the router's StillWaits panics as the
// dispatcher asks it, under the queue's lock, whether a session's turn still waits
// for its full worker (holder_wait). The process goes on and the lock is free: the
// answer counts as no, so the turn gets a whole decision (which says it still waits),
// and it goes to its worker when that frees.
func TestAPanickingStillWaitsCountsAsNo(t *testing.T) {
	var tries atomic.Int32
	cfg := DefaultConfig()
	cfg.HolderWait = time.Minute // the fake clock never gets there
	f := newFleetOf(t, 2, cfg, nil)
	q, retry := f.withRetries(t, cfg, f.countingTurnTries(&tries, func(*router.HolderBusyError) bool { panic("injected fault") }))
	first, other, turn := f.turnWaitingForItsWorker(t, q)

	retry <- time.Now()
	require.Eventually(t, func() bool { return tries.Load() == 2 }, 10*time.Second, time.Millisecond, "decided again")
	f.awaitRequeued(t)
	assert.Equal(t, 1, heldWithin(t, q), "it still waits")
	require.True(t, first.Release())
	turn.wait(t)
	require.NoError(t, turn.err)
	assert.Equal(t, first.Worker, turn.decision.Worker)
	turn.decision.Release()
	other.Release()
	assert.Equal(t, 0, heldWithin(t, q))
	assert.Equal(t, 1.0, backgroundtest.Panics(t, f.registry, background.LoopFlowControl), "asked once, at the retry interval: its panic counted once")
}
