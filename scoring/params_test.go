package scoring

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryWeightIsSettableValidatedAndOverridable walks Params' fields, so a weight
// added to the struct but left out of Set's map, Validate's list or the JSON tags (the
// policy API and per-route overrides decode JSON) fails here.
func TestEveryWeightIsSettableValidatedAndOverridable(t *testing.T) {
	typ := reflect.TypeFor[Params]()
	var weights []string
	for f := range typ.Fields() {
		if f.Type.Kind() != reflect.Float64 {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		require.Equal(t, name, f.Tag.Get("json"), "%s: YAML and JSON name it alike", f.Name)
		weights = append(weights, f.Name)
		t.Run(name, func(t *testing.T) {
			field := func(p *Params) float64 { return reflect.ValueOf(p).Elem().FieldByName(f.Name).Float() }

			var set Params
			require.NoError(t, set.Set(name, "0.5"), "Set knows it")
			assert.Equal(t, 0.5, field(&set))

			applied, err := Params{}.ApplyJSON(fmt.Appendf(nil, `{%q: 0.5}`, name))
			require.NoError(t, err, "a policy update or route override can name it")
			assert.Equal(t, 0.5, field(&applied))

			for _, v := range []float64{-1, 2 * MaxParam} {
				bad := Params{}
				reflect.ValueOf(&bad).Elem().FieldByName(f.Name).SetFloat(v)
				var fe *FieldError
				require.ErrorAs(t, bad.Validate(), &fe, "Validate checks it at %v", v)
				assert.Equal(t, name, fe.Field)
			}
		})
	}
	assert.Contains(t, weights, "InterferenceWeight")
	assert.Contains(t, weights, "PrefillHistoryWeight")
	assert.Contains(t, weights, "PrefillHistoryHalfLife")
}

func TestTheLargestWeightsKeepEveryCostFinite(t *testing.T) {
	// Every weight at its bound, a 64M-token prompt a worker holds none of, 10,000
	// requests on it: no term may overflow, and the session credit may not meet an
	// infinite charge (Inf − Inf is NaN, which no comparison orders).
	p := Params{FloorPrefill: true, SharedPrefixAffinity: 1}
	for _, w := range []*float64{&p.OverlapCredit, &p.PrefillLoadScale, &p.ActiveRequestWeight, &p.PrefixAffinityWeight,
		&p.CachePressureWeight, &p.SessionAffinityWeight, &p.QueueWeight, &p.InterferenceWeight, &p.MemoryWeight, &p.PrefillHistoryWeight, &p.PrefillHistoryHalfLife, &p.Temperature} {
		*w = MaxParam
	}
	require.NoError(t, p.Validate())
	req := &Request{PromptTokens: 64 << 20, BlockSize: 64, Blocks: make([]uint64, 1<<20)}
	c := Candidate{PrefillTokens: 64 << 20, ActiveBlocks: 1 << 20, NewBlocks: 1 << 20, ActiveRequests: 10_000,
		PendingRequests: 10_000, MaxNumSeqs: 1, HeldBlocks: 1 << 20, CapacityBlocks: 1 << 20, SessionWorker: true,
		PrefillHistory: 1e18}
	got := p.Cost(req, c)
	assert.False(t, math.IsNaN(got.Cost) || math.IsInf(got.Cost, 0), "cost %v", got.Cost)
}

func TestValidatingValidParamsAllocatesNothing(t *testing.T) {
	// Validate runs per request when a route overrides the policy.
	p := DefaultParams()
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	}))
}

// TestDefaultParamsForScalesThePerRequestWeights: the weights per request stand for
// tokens of prefill (chosen in blocks of ReferenceBlockSize), the weights per block do
// not depend on its size.
func TestDefaultParamsForScalesThePerRequestWeights(t *testing.T) {
	def := DefaultParams()
	for _, tt := range []struct {
		blockSize int
		scale     float64
	}{{0, 1}, {ReferenceBlockSize, 1}, {16, 4}, {1, 64}, {256, 0.25}} {
		p := DefaultParamsFor(tt.blockSize)
		want := def
		want.QueueWeight, want.LoRAWeight, want.ActiveRequestWeight = def.QueueWeight*tt.scale, def.LoRAWeight*tt.scale, def.ActiveRequestWeight*tt.scale
		assert.Equal(t, want, p, "block size %d", tt.blockSize)
		require.NoError(t, p.Validate(), "block size %d", tt.blockSize)
	}
}
