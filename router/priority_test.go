package router

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// engineLoads is each worker's engine reading, as a scraper would give it.
type engineLoads map[string]priority.Load

func (e engineLoads) EngineLoad(worker string) (int, float64, time.Duration, bool) {
	l := e[worker]
	return l.Waiting, l.KVUtilization, l.Age, l.Known
}

// newPriorityRouter is two workers (a, b) behind GIE's default saturation rule, with
// the objectives batch (-1) and chat (10).
func newPriorityRouter(t *testing.T, loads engineLoads, workers ...Worker) (*Router, *scoring.Bookings, *Metrics) {
	t.Helper()
	if len(workers) == 0 {
		workers = twoWorkers()
	}
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	bookings, metrics := scoring.NewBookings(), NewMetrics(prometheus.NewRegistry())
	r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true,
		Metrics: metrics, Objectives: priority.NewObjectives(map[string]int{"batch": -1, "chat": 10}),
		Saturation: priority.DefaultConfig().Saturation(), EngineLoad: loads,
	})
	require.NoError(t, err)
	return r, bookings, metrics
}

func TestSheddableRequestsAreRefusedOnlyWhenNoCandidateHasCapacity(t *testing.T) {
	idle := priority.Load{Known: true, Age: 10 * time.Millisecond}
	queued := priority.Load{Known: true, Age: 10 * time.Millisecond, Waiting: 6}
	full := priority.Load{Known: true, Age: 10 * time.Millisecond, KVUtilization: 0.9}
	tests := []struct {
		name      string
		objective string
		loads     engineLoads
		want      string // the worker, or "" for ErrSaturated
	}{
		{"sheddable, every queue past the threshold", "batch", engineLoads{"a": queued, "b": queued}, ""},
		{"sheddable, every KV cache past the threshold", "batch", engineLoads{"a": full, "b": full}, ""},
		{"sheddable, no engine metrics read", "batch", engineLoads{}, ""},
		{"sheddable, one worker with capacity gets it", "batch", engineLoads{"a": queued, "b": idle}, "b"},
		{"sheddable, the other one", "batch", engineLoads{"a": idle, "b": full}, "a"},
		{"critical, saturated", "chat", engineLoads{"a": queued, "b": full}, "any"},
		{"no objective, saturated", "", engineLoads{"a": queued, "b": queued}, "any"},
		{"an objective no source defines is priority 0, saturated", "nightly", engineLoads{"a": queued, "b": queued}, "any"},
		{"sheddable, idle", "batch", engineLoads{"a": idle, "b": idle}, "any"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, bookings, metrics := newPriorityRouter(t, tt.loads)
			d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40), Objective: tt.objective})
			if tt.want == "" {
				assert.ErrorIs(t, err, ErrSaturated)
				assert.Equal(t, 1.0, testutil.ToFloat64(metrics.sheds), "counted")
				for _, w := range []string{"a", "b"} {
					assert.Zero(t, bookings.Load(w).ActiveRequests, "nothing booked on %s", w)
				}
				return
			}
			require.NoError(t, err)
			defer d.Release()
			if tt.want != "any" {
				assert.Equal(t, tt.want, d.Worker)
			}
			assert.Zero(t, testutil.ToFloat64(metrics.sheds))
		})
	}
}

// Between two scrapes the engines' queues are what they were: the requests kvroute
// booked past a worker's batch slots are its queue at once.
func TestRequestsBookedPastTheBatchSlotsSaturateBeforeTheNextScrape(t *testing.T) {
	idle := priority.Load{Known: true}
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxNumSeqs: 1}, {Name: "b", Address: "127.0.0.1:8002", MaxNumSeqs: 1}}
	r, _, _ := newPriorityRouter(t, engineLoads{"a": idle, "b": idle}, workers...)
	ctx := context.Background()
	route := func(objective string, n int, subset ...string) (*Decision, error) {
		return r.Route(ctx, &Request{Model: "m", Tokens: tokens(100*n, 8), Objective: objective, Subset: subset})
	}
	var booked []*Decision
	defer func() {
		for _, d := range booked {
			d.Release()
		}
	}()
	// Six critical requests on each worker: one running, five queued past its one slot,
	// GIE's threshold, not past it.
	for i := range 12 {
		d, err := route("chat", i, workers[i%2].Address)
		require.NoError(t, err)
		booked = append(booked, d)
	}
	for i := range 2 {
		d, err := route("batch", 100+i)
		require.NoError(t, err, "sheddable request %d: a worker has capacity", i)
		booked = append(booked, d)
	}
	assert.NotEqual(t, booked[12].Worker, booked[13].Worker, "each worker took one more, then had none")
	_, err := route("batch", 102)
	assert.ErrorIs(t, err, ErrSaturated, "the engines' readings are still idle: the bookings saturate")
	d, err := route("chat", 103, workers[1].Address)
	require.NoError(t, err, "a critical request is never shed")
	booked = append(booked, d)

	booked[0].Release() // one of a's ends
	d, err = route("batch", 104)
	require.NoError(t, err, "a's queue is back within the threshold")
	assert.Equal(t, "a", d.Worker)
	booked = append(booked, d)
}

func TestADecisionNamesItsObjectiveAndPriority(t *testing.T) {
	r, _, _ := newPriorityRouter(t, engineLoads{"a": {Known: true}, "b": {Known: true}})
	for objective, want := range map[string]int{"batch": -1, "chat": 10, "nightly": 0, "": 0} {
		d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 8), Objective: objective})
		require.NoError(t, err)
		assert.Equal(t, objective, d.Objective)
		assert.Equal(t, want, d.Priority, "objective %q", objective)
		d.Release()
	}
}

// A sheddable request's prompt goes to a prefill worker only if that worker has
// capacity, as its destination must: with none, its destination prefills it (as when
// every prefill worker is at max_active_requests_per_worker), and it is not refused
// while the destination has capacity. It used to be split onto a saturated prefill
// worker, adding work where the critical requests queue. A request of priority 0 or
// more is split as ever.
func TestASheddableRequestIsPrefilledOnlyWhereThereIsCapacity(t *testing.T) {
	idle := priority.Load{Known: true}
	queued := priority.Load{Known: true, Waiting: 6}
	tests := []struct {
		name        string
		objective   string
		loads       engineLoads
		wantPrefill string // "": no split
		wantReason  string
	}{
		{"sheddable, every prefill worker saturated", "batch",
			engineLoads{"decode-0": idle, "decode-1": idle, "prefill-0": queued, "prefill-1": queued}, "", DecodeOnlyNoPrefillWorker},
		{"sheddable, prefill metrics never read", "batch",
			engineLoads{"decode-0": idle, "decode-1": idle}, "", DecodeOnlyNoPrefillWorker},
		{"sheddable, one prefill worker with capacity", "batch",
			engineLoads{"decode-0": idle, "decode-1": idle, "prefill-0": queued, "prefill-1": idle}, "prefill-1", ""},
		{"critical, every prefill worker saturated", "chat",
			engineLoads{"decode-0": idle, "decode-1": idle, "prefill-0": queued, "prefill-1": queued}, "any", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, bookings, _ := newPriorityRouter(t, tt.loads, pdWorkers()...)
			d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40), Objective: tt.objective})
			require.NoError(t, err, "the destinations have capacity")
			defer d.Release()
			assert.Equal(t, tt.wantReason, d.DecodeOnly)
			switch tt.wantPrefill {
			case "":
				assert.Nil(t, d.Prefill)
				for _, w := range []string{"prefill-0", "prefill-1"} {
					assert.Zero(t, bookings.Load(w).ActiveRequests, "nothing booked on %s", w)
				}
			case "any":
				require.NotNil(t, d.Prefill)
			default:
				require.NotNil(t, d.Prefill)
				assert.Equal(t, tt.wantPrefill, d.Prefill.Worker)
			}
		})
	}
}

// TestHoldOnSaturationRefusesEveryPriorityOnlyWhenEveryWorkerIsSaturated pins
// Request.HoldOnSaturation (flow_control.hold_on_saturation): a request of any priority
// is refused with ErrSaturated, for flow control to hold, when every candidate's fresh
// reading is past a threshold; one candidate with capacity, or one without a fresh
// reading, and it is routed as without the flag, among every candidate.
func TestHoldOnSaturationRefusesEveryPriorityOnlyWhenEveryWorkerIsSaturated(t *testing.T) {
	idle := priority.Load{Known: true, Age: 10 * time.Millisecond}
	queued := priority.Load{Known: true, Age: 10 * time.Millisecond, Waiting: 6}
	full := priority.Load{Known: true, Age: 10 * time.Millisecond, KVUtilization: 0.9}
	// A reading engine_metrics no longer trusts (older than its own bound) is not Known.
	stale := priority.Load{Known: false, Age: time.Hour, Waiting: 6}
	tests := []struct {
		name      string
		objective string
		hold      bool
		loads     engineLoads
		saturated bool
	}{
		{"priority 0, every worker saturated: refused", "", true, engineLoads{"a": queued, "b": full}, true},
		{"critical, every worker saturated: refused", "chat", true, engineLoads{"a": queued, "b": queued}, true},
		{"without the flag: routed", "", false, engineLoads{"a": queued, "b": full}, false},
		{"one worker with capacity: routed", "", true, engineLoads{"a": queued, "b": idle}, false},
		{"no engine reading: routed", "", true, engineLoads{}, false},
		{"one reading no longer trusted: routed", "", true, engineLoads{"a": queued, "b": stale}, false},
		{"sheddable, no reading: refused as before", "batch", true, engineLoads{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, bookings, metrics := newPriorityRouter(t, tt.loads)
			d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40), Objective: tt.objective,
				HoldOnSaturation: tt.hold, Held: tt.hold})
			if tt.saturated {
				assert.ErrorIs(t, err, ErrSaturated)
				for _, w := range []string{"a", "b"} {
					assert.Zero(t, bookings.Load(w).ActiveRequests, "nothing booked on %s", w)
				}
				assert.Zero(t, testutil.ToFloat64(metrics.sheds), "a held request is no shed")
				return
			}
			require.NoError(t, err)
			d.Release()
		})
	}
}

// With HoldOnSaturation a request of priority 0 is not narrowed to the workers with
// capacity, as a sheddable one is: the one holding its prompt still takes it.
func TestHoldOnSaturationDoesNotMoveARequestOffItsCacheHolder(t *testing.T) {
	idle := priority.Load{Known: true, Age: 10 * time.Millisecond}
	queued := priority.Load{Known: true, Age: 10 * time.Millisecond, Waiting: 6}
	r, _, _ := newPriorityRouter(t, engineLoads{"a": idle, "b": idle})
	prompt := tokens(0, 400)
	first, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	first.Release()
	holder := first.Worker
	other := map[string]string{"a": "b", "b": "a"}[holder]
	r.deps.EngineLoad = engineLoads{holder: queued, other: idle}
	d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: append(prompt, tokens(1000, 8)...), HoldOnSaturation: true, Held: true})
	require.NoError(t, err)
	assert.Equal(t, holder, d.Worker)
	d.Release()
}
