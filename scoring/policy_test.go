package scoring

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestApplyJSONChangesOnlyTheNamedKeys(t *testing.T) {
	base := DefaultParams()
	tests := []struct {
		name    string
		raw     string
		want    func(p *Params)
		wantErr string
	}{
		{"one key", `{"prefix_affinity_weight": 2}`, func(p *Params) { p.PrefixAffinityWeight = 2 }, ""},
		{"two keys", `{"temperature": 0.5, "floor_prefill": false}`, func(p *Params) { p.Temperature, p.FloorPrefill = 0.5, false }, ""},
		{"session affinity", `{"session_affinity_weight": 1}`, func(p *Params) { p.SessionAffinityWeight = 1 }, ""},
		{"negative session affinity", `{"session_affinity_weight": -1}`, nil, "session_affinity_weight: must be finite and ≥ 0"},
		{"empty object", `{}`, func(*Params) {}, ""},
		{"unknown key", `{"alpha": 2}`, nil, `unknown field "alpha"`},
		{"a key in other capitals is not the key", `{"Queue_Weight": 0}`, nil, `unknown policy key "Queue_Weight": keys are case-sensitive (did you mean "queue_weight"?)`},
		{"a key with a long s is not the key", `{"ſession_affinity_weight": 5}`, nil, `unknown policy key "ſession_affinity_weight": keys are case-sensitive (did you mean "session_affinity_weight"?)`},
		{"a key with a Kelvin sign is not the key", `{"disaggregate_to\u212aens": 5}`, nil, `keys are case-sensitive (did you mean "disaggregate_tokens"?)`},
		{"a key given twice", `{"queue_weight": 8, "temperature": 1, "queue_weight": 0}`, nil, `policy key "queue_weight" given twice`},
		{"a nested value is the decoder's to refuse", `{"temperature": {"queue_weight": 1}}`, nil, "temperature"},
		{"ill-typed: the key and both types named", `{"overlap_credit": "high"}`, nil, "overlap_credit: must be a number, got a string"},
		{"ill-typed flag", `{"floor_prefill": 1}`, nil, "floor_prefill: must be true or false, got a number"},
		{"ill-typed: an object in place of a number", `{"queue_weight": {}}`, nil, "queue_weight: must be a number, got an object"},
		{"invalid value", `{"cache_pressure_weight": -1}`, nil, "cache_pressure_weight: must be finite and ≥ 0"},
		// A number past float64's range is a number out of bounds, as Validate words it,
		// not one of the wrong type ("must be a number, got a number 1e400").
		{"a number past float64's range is out of bounds", `{"overlap_credit": 1e400}`, nil, "overlap_credit: must be at most 1e+06, got 1e400"},
		{"a negative number past float64's range is out of bounds", `{"queue_weight": -1e400}`, nil, "queue_weight: must be finite and ≥ 0, got -1e400"},
		{"trailing data", `{} {}`, nil, "trailing data"},
		{"a stray closing brace after the object is trailing data", `{"queue_weight": 8}}{"temperature": 1}`, nil, "trailing data"},
		{"a stray closing bracket after the object is trailing data", `{"queue_weight": 8}]`, nil, "trailing data"},
		{"white space after the object is not", "{\"temperature\": 1} \r\n\t", func(p *Params) { p.Temperature = 1 }, ""},
		{"not an object", `[1]`, nil, "not a JSON object"},
		{"null: an update names keys", `null`, nil, "not a JSON object"},
		{"null after blanks", " \n null", nil, "not a JSON object"},
		{"empty body", ``, nil, "not a JSON object"},
		{"an object after blanks", " \n {\"temperature\": 1}", func(p *Params) { p.Temperature = 1 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := base.ApplyJSON([]byte(tt.raw))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				assert.Equal(t, base, got, "nothing changes on error")
				return
			}
			require.NoError(t, err)
			want := base
			tt.want(&want)
			assert.Equal(t, want, got)
		})
	}
}

func TestPolicyUpdatesTakeEffectOnTheNextDecision(t *testing.T) {
	policy, err := NewPolicy(DynamoParams())
	require.NoError(t, err)
	picker := NewKVCostWithPolicy(policy, nil)
	// DESIGN §3's reference decision: the cold worker wins with the defaults, the
	// holder with α = 0.25.
	req := &Request{PromptTokens: 3008, BlockSize: 64}
	candidates := []Candidate{{Worker: "holder", Overlap: 46, ActiveBlocks: 143}, {Worker: "cold", ActiveBlocks: 95}}
	d, err := picker.Pick(context.Background(), req, candidates)
	require.NoError(t, err)
	assert.Equal(t, "cold", d.Worker)

	before, after, err := policy.Update([]byte(`{"prefix_affinity_weight": 0.25}`))
	require.NoError(t, err)
	assert.Equal(t, [2]float64{0, 0.25}, [2]float64{before.PrefixAffinityWeight, after.PrefixAffinityWeight}, "the set replaced and the new one")
	d, err = picker.Pick(context.Background(), req, candidates)
	require.NoError(t, err)
	assert.Equal(t, "holder", d.Worker)

	_, _, err = policy.Update([]byte(`{"prefix_affinity_weight": -1}`))
	require.Error(t, err)
	assert.Equal(t, 0.25, policy.Params().PrefixAffinityWeight, "a rejected update changes nothing")
}

func TestConcurrentPolicyUpdatesAreNotLost(t *testing.T) {
	policy, err := NewPolicy(DynamoParams())
	require.NoError(t, err)
	var wg sync.WaitGroup
	keys := []string{"overlap_credit", "prefill_load_scale", "active_request_weight", "prefix_affinity_weight", "cache_pressure_weight"}
	for i, key := range keys {
		wg.Go(func() {
			_, _, err := policy.Update(fmt.Appendf(nil, `{%q: %d}`, key, i+10))
			assert.NoError(t, err)
		})
		wg.Go(func() { _ = policy.Params() })
	}
	wg.Wait()
	got := policy.Params()
	assert.Equal(t, []float64{10, 11, 12, 13, 14}, []float64{got.OverlapCredit, got.PrefillLoadScale, got.ActiveRequestWeight, got.PrefixAffinityWeight, got.CachePressureWeight},
		"each update applied on top of the others")
}

// FuzzApplyJSON: a policy document from a route's metadata or the admin API never
// panics, never yields an invalid policy, and leaves the base unchanged on error.
func FuzzApplyJSON(f *testing.F) {
	for _, seed := range []string{`{"prefix_affinity_weight": 2}`, `{}`, `{"temperature": -1}`, `{"floor_prefill": "x"}`,
		`{"overlap_credit": 1e400}`, `{"session_affinity_weight": 0.5}`, `[]`, `{"a":1}`, `{} {}`, `{"temperature": 1}}`, `null`, ``,
		`{"queue_weight": 64, "shared_prefix_affinity": 0.5}`, `{"shared_prefix_affinity": 1.0000001}`,
		`{"Temperature": 1}`, `{"temperature": 1, "temperature": 2}`} {
		f.Add([]byte(seed))
	}
	base := DefaultParams()
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := base.ApplyJSON(raw)
		if err != nil {
			if got != base {
				t.Fatalf("error %v but the result changed: %+v", err, got)
			}
			return
		}
		if verr := got.Validate(); verr != nil {
			t.Fatalf("accepted an invalid policy from %q: %v", raw, verr)
		}
	})
}
