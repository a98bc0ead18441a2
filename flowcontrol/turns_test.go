package flowcontrol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// checkTurns checks g's turns against its queues: each band's flows in strictly
// increasing turn order, each flow pointing at its band, element and the group's turn
// of its fairness id, each turn's flows exactly the live flows pointing at it, and no
// turn without flows.
func checkTurns(t *testing.T, g *group, step int) {
	t.Helper()
	seen := map[*turn][]*flow{}
	for holder, mq := range g.queues {
		require.NotEmpty(t, mq.bands, "step %d: empty queue %q", step, holder)
		for _, b := range mq.bands {
			require.NotZero(t, b.flows.Len(), "step %d", step)
			var last uint64
			for e := b.flows.Front(); e != nil; e = e.Next() {
				f := e.Value.(*flow)
				require.Same(t, b, f.band, "step %d: band pointer", step)
				require.Same(t, e, f.element, "step %d", step)
				require.Greater(t, f.turn.at, last, "step %d: band out of turn order", step)
				last = f.turn.at
				require.Same(t, g.turns[flowKey{b.priority, f.id}], f.turn, "step %d: turn not the group's", step)
				require.NotZero(t, f.waiters.Len(), "step %d", step)
				seen[f.turn] = append(seen[f.turn], f)
			}
		}
	}
	for k, tu := range g.turns {
		require.ElementsMatch(t, seen[tu], tu.flows, "step %d: flows of %v", step, k)
		require.NotEmpty(t, tu.flows, "step %d: turn %v leaked", step, k)
	}
	require.Len(t, seen, len(g.turns), "step %d", step)
}

// TestTurnsStayInOrderAcrossAGroupsQueues drives a model's queues (any worker's, twice as
// often, and two workers') through random arrivals, dispatches of the next head and of
// other requests, moves between queues and departures, and checks after each step the
// turns' bookkeeping (checkTurns) and each queue's head against the promise: the
// highest priority, then the fairness id whose turn (one per priority in the group,
// given as it comes or is served, kept across a move, forgotten with its last request)
// comes first, then the oldest.
func TestTurnsStayInOrderAcrossAGroupsQueues(t *testing.T) {
	objectives := priorities{"high": 5, "": 0, "low": -1}
	holders := []string{"", "", "w0", "w1"}
	for seed := range uint64(10) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			cfg := DefaultConfig()
			cfg.Enabled = true
			q, err := New(cfg, Deps{Router: objectives, Ledger: noLedger{}})
			require.NoError(t, err)
			g := newGroup()
			g.dispatching = true
			q.groups["m"] = g
			// The reference: a turn per key, kept while a request of the key waits.
			type key struct {
				p  int
				id string
			}
			refAt := map[key]uint64{}
			var last uint64
			var queued []*waiter
			count := func(k key) int {
				n := 0
				for _, w := range queued {
					if (key{w.priority, w.req.FairnessID}) == k {
						n++
					}
				}
				return n
			}
			refRemove := func(w *waiter, dispatched bool) {
				k := key{w.priority, w.req.FairnessID}
				queued = slices.DeleteFunc(queued, func(x *waiter) bool { return x == w })
				if dispatched {
					last++
					refAt[k] = last
				}
				if count(k) == 0 {
					delete(refAt, k)
				}
			}
			for step := range 2000 {
				q.mu.Lock()
				switch op := rng.IntN(12); {
				case op < 5 || len(queued) == 0:
					req := &router.Request{Model: "m", Prompt: fmt.Sprint(step),
						Objective:  []string{"high", "", "", "low"}[rng.IntN(4)],
						FairnessID: []string{"", "a", "b", "c", "d"}[rng.IntN(5)]}
					w := q.newWaiter(context.Background(), req)
					k := key{w.priority, req.FairnessID}
					if _, ok := refAt[k]; !ok {
						last++
						refAt[k] = last
					}
					q.enqueue(context.Background(), req, w, holders[rng.IntN(len(holders))])
					queued = append(queued, w)
				case op < 7:
					w := q.next(g, 0)
					if w != nil {
						q.remove(w, true)
						refRemove(w, true)
					}
				case op < 8:
					// Dispatched though not the head (an arrival of its id during its routing).
					w := queued[rng.IntN(len(queued))]
					q.remove(w, true)
					refRemove(w, true)
				case op < 10:
					w := queued[rng.IntN(len(queued))]
					h := holders[rng.IntN(len(holders))]
					var busy *router.HolderBusyError
					if h != "" {
						busy = &router.HolderBusyError{Worker: h}
					}
					q.requeue(w, busy)
				default:
					w := queued[rng.IntN(len(queued))]
					q.remove(w, false)
					refRemove(w, false)
				}
				checkTurns(t, g, step)
				// Each queue's head against the reference.
				for holder, mq := range g.queues {
					var want *waiter
					for _, w := range queued {
						if w.holder != holder {
							continue
						}
						if want == nil || w.priority > want.priority ||
							(w.priority == want.priority && (refAt[key{w.priority, w.req.FairnessID}] < refAt[key{want.priority, want.req.FairnessID}] ||
								(refAt[key{w.priority, w.req.FairnessID}] == refAt[key{want.priority, want.req.FairnessID}] && w.seq < want.seq))) {
							want = w
						}
					}
					got := mq.head()
					require.Same(t, want, got, "step %d queue %q: want %s got %s", step, holder, want.req.Prompt, got.req.Prompt)
				}
				require.Equal(t, len(queued), q.held, "step %d", step)
				q.mu.Unlock()
			}
		})
	}
}
