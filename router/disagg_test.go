package router

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// pdWorkers is a fleet of two decode workers and two prefill workers.
func pdWorkers() []Worker {
	return []Worker{
		{Name: "decode-0", Address: "127.0.0.1:8001", Role: RoleDecode},
		{Name: "prefill-0", Address: "127.0.0.1:8101", Role: RolePrefill},
		{Name: "decode-1", Address: "127.0.0.1:8002"},
		{Name: "prefill-1", Address: "127.0.0.1:8102", Role: RolePrefill},
	}
}

// pdParams is the default policy with disaggregate_tokens set.
func pdParams(threshold float64) scoring.Params {
	p := scoring.DefaultParams()
	p.DisaggregateTokens = threshold
	return p
}

// A prefill worker is never the destination, and a request whose destination misses at
// least disaggregate_tokens of its prompt gets a prefill worker; fewer, it does not.
func TestDisaggregationSplitsByTheTokensTheDestinationMisses(t *testing.T) {
	tests := []struct {
		name        string
		threshold   float64
		warm        int // leading tokens of the prompt the destination already holds
		prompt      int
		wantPrefill bool
		wantReason  string
		wantMissing int
	}{
		{name: "cold prompt over the threshold", threshold: 16, prompt: 40, wantPrefill: true, wantMissing: 40},
		{name: "cold prompt under the threshold", threshold: 64, prompt: 40, wantReason: DecodeOnlyUnderThreshold, wantMissing: 40},
		{name: "threshold 0 always splits", threshold: 0, prompt: 5, wantPrefill: true, wantMissing: 5},
		{name: "a warm destination misses only the tail", threshold: 16, warm: 32, prompt: 40, wantReason: DecodeOnlyUnderThreshold, wantMissing: 8},
		{name: "exactly the threshold splits", threshold: 8, warm: 32, prompt: 40, wantPrefill: true, wantMissing: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, pdParams(tt.threshold), pdWorkers()...)
			ctx := context.Background()
			if tt.warm > 0 {
				require.NoError(t, f.index.Store("decode-1", blockHashesOf(t, f.router, tokens(0, tt.warm))))
			}
			d, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, tt.prompt)})
			require.NoError(t, err)
			defer d.Release()
			assert.Contains(t, []string{"decode-0", "decode-1"}, d.Worker, "a prefill worker is never the destination")
			assert.Equal(t, tt.wantMissing, d.MissingTokens)
			assert.Equal(t, tt.wantReason, d.DecodeOnly)
			if !tt.wantPrefill {
				assert.Nil(t, d.Prefill)
				return
			}
			require.NotNil(t, d.Prefill)
			assert.Contains(t, []string{"prefill-0", "prefill-1"}, d.Prefill.Worker)
			assert.Equal(t, map[string]string{"prefill-0": "127.0.0.1:8101", "prefill-1": "127.0.0.1:8102"}[d.Prefill.Worker], d.Prefill.Address)
			assert.Len(t, d.Prefill.Terms, 2, "both prefill workers were priced")
		})
	}
}

// blockHashesOf returns the block hashes the router computes for ids of model "m".
func blockHashesOf(t *testing.T, r *Router, ids []uint32) []uint64 {
	t.Helper()
	return r.prompter.blocks(&Request{Model: "m"}, ids)
}

// The prefill worker holds the request's prefill until the destination's first token,
// the destination holds no prefill of its own (the KV arrives computed), and both
// record the prompt's blocks; everything is released once.
func TestADisaggregatedRequestBooksBothWorkersAndReleasesBoth(t *testing.T) {
	f := newFixture(t, pdParams(0), pdWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	require.NotNil(t, d.Prefill)
	assert.Equal(t, scoring.Load{ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(d.Worker), "the destination computes nothing")
	assert.Equal(t, scoring.Load{PrefillTokens: 40, ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(d.Prefill.Worker))
	assert.Equal(t, 10, f.index.WorkerEntries(d.Worker))
	assert.Equal(t, 10, f.index.WorkerEntries(d.Prefill.Worker), "the prefill worker keeps the blocks it computed")

	d.FirstToken()
	assert.Equal(t, scoring.Load{}, f.bookings.Load(d.Prefill.Worker), "the destination's first token ends the prefill worker's part")
	assert.Equal(t, scoring.Load{ActiveBlocks: 10, ActiveRequests: 1}, f.bookings.Load(d.Worker))
	assert.True(t, d.Release())
	assert.False(t, d.Release())
	assert.Equal(t, scoring.Load{}, f.bookings.Load(d.Worker))

	// Cancelled before a first token: Release frees both.
	d, err = f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(1000, 40)})
	require.NoError(t, err)
	require.NotNil(t, d.Prefill)
	assert.True(t, d.Release())
	for _, w := range pdWorkers() {
		assert.Equal(t, scoring.Load{}, f.bookings.Load(w.Name), w.Name)
	}
}

// A resumed session's next turn, on the destination holding its history, misses only
// the new turn: with the shipped affinity it stays there and needs no prefill worker.
// The prefill worker that prefilled the first turn is preferred for a cold prefix of it.
func TestAResumedSessionStaysOnItsDecodeWorkerWithoutAPrefillHop(t *testing.T) {
	f := newFixture(t, pdParams(16), pdWorkers()...)
	ctx := context.Background()
	first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 200)})
	require.NoError(t, err)
	require.NotNil(t, first.Prefill)
	first.FirstToken()
	first.Release()

	// Another request loads the first turn's decode worker a little.
	other, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(5000, 8)})
	require.NoError(t, err)
	defer other.Release()

	next, err := f.router.Route(ctx, &Request{Model: "m", Tokens: append(tokens(0, 200), tokens(300, 12)...)})
	require.NoError(t, err)
	defer next.Release()
	assert.Equal(t, first.Worker, next.Worker)
	assert.Nil(t, next.Prefill)
	assert.Equal(t, DecodeOnlyUnderThreshold, next.DecodeOnly)
	assert.Equal(t, 12, next.MissingTokens)

	// A new request sharing the first turn's prefix, on the other decode worker, is
	// prefilled where that prefix is.
	f.bookings.Book(first.Worker, nil, 100000) // make the holder expensive as a destination
	shared, err := f.router.Route(ctx, &Request{Model: "m", Tokens: append(tokens(0, 200), tokens(9000, 40)...)})
	require.NoError(t, err)
	defer shared.Release()
	require.NotNil(t, shared.Prefill)
	assert.NotEqual(t, first.Worker, shared.Worker)
	assert.Equal(t, first.Prefill.Worker, shared.Prefill.Worker)
	assert.Equal(t, 200, shared.Prefill.PredictedCachedTokens)
}

// Without an eligible prefill worker the destination prefills: prefill workers out for
// health, or full at max_active_requests_per_worker. A fleet of prefill workers alone
// serves nothing.
func TestDisaggregationFallsBackToTheDestination(t *testing.T) {
	t.Run("prefill workers out for health", func(t *testing.T) {
		f := newFixture(t, pdParams(0), pdWorkers()...)
		f.router.deps.Health = outSet{"prefill-0": true, "prefill-1": true}
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		require.NoError(t, err)
		defer d.Release()
		assert.Nil(t, d.Prefill)
		assert.Equal(t, DecodeOnlyNoPrefillWorker, d.DecodeOnly)
		assert.Equal(t, scoring.Load{PrefillTokens: 40, ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(d.Worker))
	})
	t.Run("prefill workers full", func(t *testing.T) {
		idxFixture := newFixture(t, pdParams(0), pdWorkers()...)
		r, err := New(Config{BlockSize: 4, Workers: pdWorkers(), MaxActiveRequestsPerWorker: 1}, idxFixture.router.deps)
		require.NoError(t, err)
		idxFixture.bookings.Book("prefill-0", nil, 1)
		idxFixture.bookings.Book("prefill-1", nil, 1)
		d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		require.NoError(t, err)
		defer d.Release()
		assert.Nil(t, d.Prefill)
		assert.Equal(t, DecodeOnlyNoPrefillWorker, d.DecodeOnly)
	})
	t.Run("only prefill workers", func(t *testing.T) {
		f := newFixture(t, pdParams(0), Worker{Name: "p", Address: "127.0.0.1:8101", Role: RolePrefill})
		_, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		assert.ErrorIs(t, err, ErrNoWorkers)
		assert.ErrorContains(t, err, "only prefill workers")
	})
	t.Run("load-only requests have nothing to prefill", func(t *testing.T) {
		f := newFixture(t, pdParams(0), pdWorkers()...)
		d, err := f.router.Route(context.Background(), &Request{AnyModel: true, Tokens: []uint32{}})
		require.NoError(t, err)
		defer d.Release()
		assert.Nil(t, d.Prefill)
		assert.Empty(t, d.DecodeOnly)
		assert.Contains(t, []string{"decode-0", "decode-1"}, d.Worker)
	})
}

// A fleet without prefill workers decides as before: no split, no reason.
func TestAFleetWithoutPrefillWorkersNeverSplits(t *testing.T) {
	f := newFixture(t, pdParams(0), twoWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	assert.Nil(t, d.Prefill)
	assert.Empty(t, d.DecodeOnly)
	assert.Zero(t, d.MissingTokens)
}

// The threshold in force comes from the request's own parameters, then the policy's
// (runtime updates apply to the next decision).
func TestDisaggregateTokensFollowsOverridesAndThePolicy(t *testing.T) {
	f := newFixture(t, pdParams(1000), pdWorkers()...)
	policy := f.router.deps.Policy
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	f.router.deps.Picker = picker
	route := func(params *scoring.Params) *Decision {
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(rand.IntN(1<<20), 40), Params: params})
		require.NoError(t, err)
		d.Release()
		return d
	}
	assert.Nil(t, route(nil).Prefill, "the policy's 1000")
	override := pdParams(10)
	assert.NotNil(t, route(&override).Prefill, "the request's override")
	_, _, err = policy.Update([]byte(`{"disaggregate_tokens": 20}`))
	require.NoError(t, err)
	assert.NotNil(t, route(nil).Prefill, "the updated policy")
}

// The GIE subset hint names the endpoints the picker may choose from, prefill workers
// included: llm-d's picker filters every scheduling profile's candidates, prefill's
// too, by the hint (llm-d-router pkg/epp/requestcontrol/director.go, candidates.go;
// protocol: docs/proposals/004-endpoint-picker-protocol, Endpoint Subset). kvroute
// applied it to the destination alone, and sent prompts to prefill workers the data
// plane had left out.
func TestTheSubsetHintLimitsPrefillWorkersToo(t *testing.T) {
	f := newFixture(t, pdParams(0), pdWorkers()...)
	for i := range 20 {
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(100*i, 40),
			Subset: []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8102"}})
		require.NoError(t, err)
		require.NotNil(t, d.Prefill)
		assert.Equal(t, "prefill-1", d.Prefill.Worker, "prefill-0 is outside the subset")
		d.Release()
	}
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(9000, 40), Subset: []string{"127.0.0.1:8001"}})
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, "decode-0", d.Worker)
	assert.Nil(t, d.Prefill, "no prefill worker inside the subset: the destination prefills")
	assert.Equal(t, DecodeOnlyNoPrefillWorker, d.DecodeOnly)
}

// updatingPicker is a picker whose first Pick lets a runtime policy update land in the
// middle of the decision, after the destination was priced: a PUT /policy racing it.
type updatingPicker struct {
	scoring.Picker
	policy *scoring.Policy
	update string
	done   bool
}

func (p *updatingPicker) Pick(ctx context.Context, req *scoring.Request, c []scoring.Candidate) (scoring.Decision, error) {
	d, err := p.Picker.Pick(ctx, req, c)
	if !p.done {
		p.done = true
		_, _, uerr := p.policy.Update([]byte(p.update))
		if uerr != nil {
			return d, uerr
		}
	}
	return d, err
}

// A decision reads the policy once: it prices its destination, decides the split and
// prices its prefill worker with one set of parameters, as scoring.Policy promises ("a
// decision sees the old parameters or the new ones, never a mix"). The router read the
// policy again for disaggregate_tokens and prefill_history_half_life, so an update
// landing between the reads split a decision by the new threshold after pricing it by
// the old weights.
func TestARuntimeUpdateMidDecisionAppliesFromTheNextDecision(t *testing.T) {
	tests := []struct {
		name        string
		start       float64 // disaggregate_tokens when the decision starts
		update      string  // lands after the destination was priced
		wantPrefill bool
	}{
		{"raised mid-decision: still split", 0, `{"disaggregate_tokens": 1000}`, true},
		{"lowered mid-decision: still not split", 1000, `{"disaggregate_tokens": 0}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, pdParams(tt.start), pdWorkers()...)
			policy := f.router.deps.Policy
			f.router.deps.Picker = &updatingPicker{
				Picker: scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1))),
				policy: policy, update: tt.update,
			}
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.wantPrefill, d.Prefill != nil, "decode_only %q", d.DecodeOnly)

			next, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(1000, 40)})
			require.NoError(t, err)
			defer next.Release()
			assert.Equal(t, !tt.wantPrefill, next.Prefill != nil, "the next decision follows the update")
		})
	}
}
