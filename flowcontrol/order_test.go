package flowcontrol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// priorities gives each request its objective's priority, as the router would.
type priorities map[string]int

func (p priorities) Route(context.Context, *router.Request) (*router.Decision, error) {
	panic("the order test routes nothing")
}

func (p priorities) Priority(req *router.Request) int { return p[req.Objective] }

func (priorities) HasRoom(string) bool { return true }

func (priorities) StillWaits(*router.HolderBusyError) bool { return true }

type noLedger struct{}

func (noLedger) Version() uint64 { return 0 }

// refQueue is the order a model's queue promises, kept as a deficit round robin's
// lists rather than by index: the bands by priority, highest first; in each its flows
// (fairness ids) in the order of their turns, the flow whose turn it is first: a flow
// that gets a request dispatched goes to the end of the line, as does a flow that
// comes (or comes back: a flow leaves when it empties); in each flow its requests in
// arrival order.
type refQueue struct {
	bands map[int]*refBand
}

type refBand struct {
	line    []string // the flows' turns, the current one first
	waiters map[string][]*waiter
}

func (r *refQueue) add(priority int, w *waiter) {
	b := r.bands[priority]
	if b == nil {
		b = &refBand{waiters: map[string][]*waiter{}}
		r.bands[priority] = b
	}
	id := w.req.FairnessID
	if len(b.waiters[id]) == 0 {
		b.line = append(b.line, id)
	}
	b.waiters[id] = append(b.waiters[id], w)
}

func (r *refQueue) head() *waiter {
	if len(r.bands) == 0 {
		return nil
	}
	best, found := 0, false
	for p := range r.bands {
		if !found || p > best {
			best, found = p, true
		}
	}
	b := r.bands[best]
	return b.waiters[b.line[0]][0]
}

// remove takes w out; dispatched (w was the head) sends its flow to the end of the
// line. A flow that empties leaves the line.
func (r *refQueue) remove(priority int, w *waiter, dispatched bool) {
	b := r.bands[priority]
	id := w.req.FairnessID
	b.waiters[id] = slices.DeleteFunc(b.waiters[id], func(x *waiter) bool { return x == w })
	if dispatched {
		b.line = append(b.line[1:], id)
	}
	if len(b.waiters[id]) == 0 {
		b.line = slices.DeleteFunc(b.line, func(x string) bool { return x == id })
		delete(b.waiters, id)
		if len(b.line) == 0 {
			delete(r.bands, priority)
		}
	}
}

// TestQueueOrderMatchesItsPromise drives a model's queue through random arrivals,
// dispatches of its head and departures of any request, and checks after each step
// that its head is the one the order promises: the highest priority, the flow whose
// turn it is (round robin, one dispatch a turn, a flow that comes or comes back
// joining the end of the line), its oldest request.
func TestQueueOrderMatchesItsPromise(t *testing.T) {
	objectives := priorities{"high": 5, "": 0, "low": -1}
	for seed := range uint64(20) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			cfg := DefaultConfig()
			cfg.Enabled = true
			q, err := New(cfg, Deps{Router: objectives, Ledger: noLedger{}})
			require.NoError(t, err)
			// A dispatcher already serves the model's queue: this test is it.
			q.groups["m"] = newGroup()
			q.groups["m"].dispatching = true
			ref := &refQueue{bands: map[int]*refBand{}}
			var queued []*waiter
			for step := range 2000 {
				switch op := rng.IntN(10); {
				case op < 5 || len(queued) == 0:
					req := &router.Request{Model: "m", Prompt: fmt.Sprint(step),
						Objective:  []string{"high", "", "", "low"}[rng.IntN(4)],
						FairnessID: []string{"", "a", "b", "c", "d"}[rng.IntN(5)]}
					q.mu.Lock()
					w := q.enqueue(context.Background(), req, q.newWaiter(context.Background(), req), "")
					q.mu.Unlock()
					ref.add(objectives.Priority(req), w)
					queued = append(queued, w)
				case op < 8:
					q.mu.Lock()
					w := q.groups["m"].queues[""].head()
					q.remove(w, true)
					q.mu.Unlock()
					ref.remove(objectives.Priority(w.req), w, true)
					queued = slices.DeleteFunc(queued, func(x *waiter) bool { return x == w })
				default:
					w := queued[rng.IntN(len(queued))]
					q.mu.Lock()
					q.remove(w, false)
					q.mu.Unlock()
					ref.remove(objectives.Priority(w.req), w, false)
					queued = slices.DeleteFunc(queued, func(x *waiter) bool { return x == w })
				}
				q.mu.Lock()
				got := q.groups["m"].queues[""].head()
				q.mu.Unlock()
				want := ref.head()
				require.Equal(t, want == nil, got == nil, "step %d", step)
				if want != nil {
					require.Equal(t, fmt.Sprintf("%s (%q, %q)", want.req.Prompt, want.req.Objective, want.req.FairnessID),
						fmt.Sprintf("%s (%q, %q)", got.req.Prompt, got.req.Objective, got.req.FairnessID), "step %d: the head", step)
				}
				require.Equal(t, len(queued), q.Held(), "step %d", step)
			}
		})
	}
}

// BenchmarkHeldRequestLeaves: a queue holding n requests, the oldest leaves (as
// max_wait ends them, in arrival order) as one more comes, all in one flow or each in a
// flow of its own (a fairness id per request, as a hostile client may send). Each
// arrival and departure takes q.mu, which every request through flow control takes:
// their cost must not grow with n (max_queued is up to MaxMaxQueued).
func BenchmarkHeldRequestLeaves(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 14, 1 << 17} {
		for _, flows := range []string{"one flow", "a flow each"} {
			b.Run(fmt.Sprintf("%d held, %s", n, flows), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.Enabled, cfg.MaxQueued = true, MaxMaxQueued
				q, err := New(cfg, Deps{Router: priorities{}, Ledger: noLedger{}})
				require.NoError(b, err)
				q.groups["m"] = newGroup()
				q.groups["m"].dispatching = true
				next := 0
				add := func() *waiter {
					req := &router.Request{Model: "m"}
					if flows != "one flow" {
						req.FairnessID = fmt.Sprint(next)
					}
					next++
					q.mu.Lock()
					defer q.mu.Unlock()
					return q.enqueue(context.Background(), req, q.newWaiter(context.Background(), req), "")
				}
				held := make([]*waiter, 0, n)
				for range n {
					held = append(held, add())
				}
				b.ResetTimer()
				for i := range b.N {
					oldest := held[i%n]
					q.mu.Lock()
					q.remove(oldest, false)
					q.mu.Unlock()
					held[i%n] = add()
				}
			})
		}
	}
}

// TestFairnessIDsTakeTurnsAcrossAModelsQueues: a model's requests wait in several
// queues (any worker's, and with holder_wait one per busy worker), and a fairness id's
// turn is one across them: a fairness id whose request went from one queue waits for
// its next turn in every other, and one whose request moves between queues keeps its
// turn. Without fairness ids the oldest goes first, whichever queue it waits in.
func TestFairnessIDsTakeTurnsAcrossAModelsQueues(t *testing.T) {
	type arrival struct{ name, fairnessID, holder string }
	tests := []struct {
		name     string
		arrivals []arrival
		// move, when set, is moved to the queue of any worker before the dispatches.
		move string
		want []string
	}{
		{
			name: "a's request from a worker's queue passes a's turn in the others",
			arrivals: []arrival{
				{"a1", "a", "w0"}, {"a2", "a", ""}, {"b1", "b", ""},
			},
			want: []string{"a1", "b1", "a2"},
		},
		{
			name: "each fairness id in turn over three queues",
			arrivals: []arrival{
				{"a1", "a", "w0"}, {"a2", "a", "w1"}, {"a3", "a", ""}, {"b1", "b", "w1"}, {"b2", "b", ""}, {"c1", "c", ""},
			},
			want: []string{"a1", "b1", "c1", "a2", "b2", "a3"},
		},
		{
			name: "without fairness ids the oldest first across the queues",
			arrivals: []arrival{
				{"x1", "", "w0"}, {"x2", "", ""}, {"x3", "", "w1"}, {"x4", "", ""},
			},
			want: []string{"x1", "x2", "x3", "x4"},
		},
		{
			name: "a fairness id whose only request moves between queues keeps its turn",
			arrivals: []arrival{
				{"a1", "a", "w0"}, {"b1", "b", ""},
			},
			move: "a1",
			want: []string{"a1", "b1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Enabled = true
			q, err := New(cfg, Deps{Router: priorities{}, Ledger: noLedger{}})
			require.NoError(t, err)
			// A dispatcher already serves the model's queues: this test is it.
			g := newGroup()
			g.dispatching = true
			q.groups["m"] = g
			byName := map[string]*waiter{}
			q.mu.Lock()
			defer q.mu.Unlock()
			for _, a := range tt.arrivals {
				req := &router.Request{Model: "m", Prompt: a.name, FairnessID: a.fairnessID}
				byName[a.name] = q.enqueue(context.Background(), req, q.newWaiter(context.Background(), req), a.holder)
			}
			if tt.move != "" {
				q.requeue(byName[tt.move], nil)
			}
			var got []string
			for w := q.next(g, 0); w != nil; w = q.next(g, 0) {
				got = append(got, w.req.Prompt)
				q.remove(w, true)
			}
			assert.Equal(t, tt.want, got)
			assert.Empty(t, g.turns, "every turn is forgotten with its last flow")
		})
	}
}
