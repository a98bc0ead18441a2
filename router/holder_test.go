package router

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// TestARequestWaitsForItsHolderOnlyForWhatNoOtherWorkerHolds pins when a request that
// asks to wait for its holder (Request.WaitForHolder, flow_control.holder_wait) is
// refused with *HolderBusyError rather than routed elsewhere or refused as overloaded:
// only when a full worker holds more than half of its prompt beyond what every other
// worker, full or free, holds, and beyond a hot shared prefix.
func TestARequestWaitsForItsHolderOnlyForWhatNoOtherWorkerHolds(t *testing.T) {
	session := tokens(0, 40) // 10 blocks: a session's turns so far
	turn := append(slices.Clone(session), tokens(1000, 8)...)
	system := tokens(5000, 32) // 8 blocks: a system prompt many sessions share
	withSystem := func(from int) []uint32 { return append(slices.Clone(system), tokens(from, 8)...) }
	for _, tc := range []struct {
		name string
		// maxActive per worker; each step is routed pinned to its worker (a GIE
		// subset), and released when release is set (its blocks stay in the index).
		maxActive int
		steps     []step
		prompt    []uint32
		// wantHolder: HolderBusyError naming it; wantOverloaded: ErrOverloaded without
		// a holder; else routed to one of wantWorkers.
		wantHolder     string
		wantOverloaded bool
		wantWorkers    []string
	}{
		{
			name:      "its worker full and the others free: it waits for its worker",
			maxActive: 1, steps: []step{{"a", session, false}},
			prompt: turn, wantHolder: "a",
		},
		{
			name:      "every worker full, only its worker holds the prompt: it waits for its worker",
			maxActive: 1, steps: []step{{"a", session, false}, {"b", tokens(100, 8), false}, {"c", tokens(200, 8), false}},
			prompt: turn, wantHolder: "a",
		},
		{
			name:      "every worker full, two hold the prompt alike: it waits for whichever frees first",
			maxActive: 1,
			steps:     []step{{"b", session, true}, {"a", session, false}, {"b", tokens(100, 8), false}, {"c", tokens(200, 8), false}},
			prompt:    turn, wantOverloaded: true,
		},
		{
			name:      "its worker full and others free, the prompt a shared system prompt hot there: a free worker takes it",
			maxActive: 2, steps: []step{{"a", withSystem(100), false}, {"a", withSystem(200), false}},
			prompt: withSystem(300), wantWorkers: []string{"b", "c"},
		},
		{
			name:      "a short prefix in common: a free worker takes it",
			maxActive: 1, steps: []step{{"a", session, false}},
			prompt: append(tokens(0, 8), tokens(3000, 40)...), wantWorkers: []string{"b", "c"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newThreeWorkerRouter(t, tc.maxActive)
			ctx := context.Background()
			for i, s := range tc.steps {
				d, err := r.Route(ctx, &Request{Model: "m", Tokens: s.prompt, Subset: []string{addressOf(s.worker)}})
				require.NoError(t, err, "step %d", i)
				require.Equal(t, s.worker, d.Worker)
				if s.release {
					require.True(t, d.Release())
				}
			}
			d, err := r.Route(ctx, &Request{Model: "m", Tokens: tc.prompt, WaitForHolder: true})
			var busy *HolderBusyError
			switch {
			case tc.wantHolder != "":
				require.ErrorAs(t, err, &busy)
				assert.Equal(t, tc.wantHolder, busy.Worker)
				assert.ErrorIs(t, err, ErrOverloaded, "flow control holds it as it holds an overloaded request")
			case tc.wantOverloaded:
				require.ErrorIs(t, err, ErrOverloaded)
				assert.False(t, errors.As(err, &busy), "no worker to wait for: %v", err)
			default:
				require.NoError(t, err)
				assert.Contains(t, tc.wantWorkers, d.Worker)
				d.Release()
			}
		})
	}
}

// step is a request routed to worker before the one a test looks at.
type step struct {
	worker  string
	prompt  []uint32
	release bool
}

func addressOf(worker string) string {
	return map[string]string{"a": "127.0.0.1:8001", "b": "127.0.0.1:8002", "c": "127.0.0.1:8003", "d": "127.0.0.1:8004"}[worker]
}

// newThreeWorkerRouter is a router of workers a, b and c (addressOf) at maxActive
// requests each, with blocks of 4 tokens and the default cost.
func newThreeWorkerRouter(t *testing.T, maxActive int) *Router {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	var workers []Worker
	for _, name := range []string{"a", "b", "c"} {
		require.NoError(t, idx.SetWorker(name, 0))
		workers = append(workers, Worker{Name: name, Address: addressOf(name)})
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	r, err := New(Config{BlockSize: 4, Workers: workers, MaxActiveRequestsPerWorker: maxActive}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true,
	})
	require.NoError(t, err)
	return r
}

// TestHasRoomCountsTheRequestsADecisionCounts: a worker has room below
// max_active_requests_per_worker, counting this replica's bookings, its peers' and its
// engine's requests kvroute did not route, as the decision's own test for a full
// worker does; without a limit every worker has room.
func TestHasRoomCountsTheRequestsADecisionCounts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxActive int
		own, peer int
		engine    int // what the engine says it runs and queues
		want      bool
	}{
		{"no limit", 0, 5, 0, 0, true},
		{"below the limit", 2, 1, 0, 0, true},
		{"at the limit with its own bookings", 2, 2, 0, 0, false},
		{"at the limit with a peer's", 2, 1, 1, 0, false},
		{"at the limit with requests past kvroute", 2, 1, 0, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newThreeWorkerRouter(t, tc.maxActive)
			for range tc.own {
				_, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 8), Subset: []string{addressOf("a")}})
				require.NoError(t, err)
			}
			if tc.peer > 0 {
				r.deps.Bookings.SetPeerLoad("a", scoring.Load{ActiveRequests: tc.peer})
			}
			if tc.engine > 0 {
				r.deps.Bookings.SetEngineRequests("a", tc.engine)
			}
			assert.Equal(t, tc.want, r.HasRoom("a"))
			assert.True(t, r.HasRoom("b"), "an idle worker has room")
		})
	}
}

// outFor is a health check with the named workers out for a back-off.
type outFor map[string]bool

func (o outFor) Eligible(worker string) bool { return !o[worker] }

// TestAFullWorkerNoDecisionWaitsForHasRoom: a worker at the limit that left the fleet,
// or is out for a health back-off, is no candidate, so no decision makes a request
// wait for it (HolderBusyError): HasRoom does not hold back a request waiting for it.
func TestAFullWorkerNoDecisionWaitsForHasRoom(t *testing.T) {
	r := newThreeWorkerRouter(t, 1)
	_, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 8), Subset: []string{addressOf("a")}})
	require.NoError(t, err)
	require.False(t, r.HasRoom("a"), "full")
	r.deps.Health = outFor{"a": true}
	assert.True(t, r.HasRoom("a"), "out for a back-off")
	r.deps.Health = nil
	require.NoError(t, r.SetWorkers(slices.DeleteFunc(r.Workers(), func(w Worker) bool { return w.Name == "a" })))
	assert.True(t, r.HasRoom("a"), "out of the fleet, its request still booked")
}

// TestStillWaitsTellsWhetherARefusedRequestWouldStillWaitForItsWorker: a request
// refused to wait for its full worker (HolderBusyError) is asked again, without a
// decision, whether a decision would still make it wait for that worker: yes while the
// index and the bookings say the same, whatever comes and goes elsewhere; no once
// another worker holds its prompt too, once its prefix is a hot shared one, or once
// its worker has room.
func TestStillWaitsTellsWhetherARefusedRequestWouldStillWaitForItsWorker(t *testing.T) {
	session := tokens(0, 40) // 10 blocks: a session's turns so far
	turn := append(slices.Clone(session), tokens(1000, 8)...)
	unrelated := tokens(100, 8)
	for _, tc := range []struct {
		name      string
		maxActive int
		// before are routed, pinned to their workers, before the turn is refused; after
		// changes what the router sees once it was, with before's decisions.
		before []step
		// out are out for a health back-off from the turn's refusal on.
		out   []string
		after func(t *testing.T, r *Router, before []*Decision)
		want  bool
	}{
		{
			name:      "requests come and go on the other workers: it still waits",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				routeTo(t, r, "b", unrelated).Release()
				routeTo(t, r, "c", tokens(200, 8))
			},
			want: true,
		},
		{
			name:      "another worker holds the prompt too: no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				routeTo(t, r, "b", session).Release()
			},
		},
		{
			name:      "its prefix turned into a hot shared one on its worker: no",
			maxActive: 2, before: []step{{"a", session, false}, {"a", unrelated, false}},
			after: func(t *testing.T, r *Router, before []*Decision) {
				require.True(t, before[1].Release())
				routeTo(t, r, "a", append(slices.Clone(session), tokens(2000, 8)...))
			},
		},
		{
			name:      "its worker has room: no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, before []*Decision) {
				require.True(t, before[0].Release())
			},
		},
		{
			name:      "its worker is out for a health back-off: no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				r.deps.Health = outFor{"a": true}
			},
		},
		{
			name:      "every worker is out for a back-off (a decision routes among all): it still waits",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				r.deps.Health = outFor{"a": true, "b": true, "c": true}
			},
			want: true,
		},
		{
			name:      "its worker left the fleet: no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				require.NoError(t, r.SetWorkers(slices.DeleteFunc(r.Workers(), func(w Worker) bool { return w.Name == "a" })))
			},
		},
		{
			name:      "its worker no longer serves the model (a reload): no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				workers := r.Workers()
				workers[0].Models = []string{"another model"}
				require.NoError(t, r.SetWorkers(workers))
			},
		},
		{
			name:      "another worker holding the prompt too, out for a back-off as it was refused, stays out: it still waits",
			maxActive: 1, before: []step{{"b", session, true}, {"a", session, false}}, out: []string{"b"},
			after: func(*testing.T, *Router, []*Decision) {},
			want:  true,
		},
		{
			name:      "another worker holding the prompt too, out for a back-off as it was refused, is back: no",
			maxActive: 1, before: []step{{"b", session, true}, {"a", session, false}}, out: []string{"b"},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				r.deps.Health = nil
			},
		},
		{
			name:      "a worker added that holds the prompt too: no",
			maxActive: 1, before: []step{{"a", session, false}},
			after: func(t *testing.T, r *Router, _ []*Decision) {
				require.NoError(t, r.deps.Index.(*index.Index).SetWorker("d", 0))
				require.NoError(t, r.SetWorkers(append(r.Workers(), Worker{Name: "d", Address: addressOf("d")})))
				routeTo(t, r, "d", session).Release()
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newThreeWorkerRouter(t, tc.maxActive)
			var before []*Decision
			for _, s := range tc.before {
				before = append(before, routeTo(t, r, s.worker, s.prompt))
			}
			if tc.out != nil {
				out := outFor{}
				for _, w := range tc.out {
					out[w] = true
				}
				r.deps.Health = out
			}
			_, err := r.Route(context.Background(), &Request{Model: "m", Tokens: turn, WaitForHolder: true})
			var busy *HolderBusyError
			require.ErrorAs(t, err, &busy)
			require.Equal(t, "a", busy.Worker)
			require.True(t, r.StillWaits(busy), "nothing changed yet")
			tc.after(t, r, before)
			assert.Equal(t, tc.want, r.StillWaits(busy))
		})
	}
	t.Run("a refusal the router did not make: it still waits", func(t *testing.T) {
		assert.True(t, newThreeWorkerRouter(t, 1).StillWaits(&HolderBusyError{Worker: "a"}))
	})
}

// routeTo routes prompt pinned to worker (a GIE subset).
func routeTo(t *testing.T, r *Router, worker string, prompt []uint32) *Decision {
	t.Helper()
	d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt, Subset: []string{addressOf(worker)}})
	require.NoError(t, err)
	require.Equal(t, worker, d.Worker)
	return d
}
