package explain

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// split is decision(n, 0, name) prefilled by the first of m prefill candidates named
// prefill(i), which cost i blocks, at 10.0.1.i:8000.
func split(n int, name func(int) string, m int, prefill func(int) string) *router.Decision {
	d := decision(n, 0, name)
	d.MissingTokens = 512
	p := &router.Prefill{Address: "10.0.1.0:8000", PredictedCachedTokens: 64}
	p.Chosen, p.Worker = 0, prefill(0)
	for i := range m {
		p.Terms = append(p.Terms, scoring.Terms{Candidate: scoring.Candidate{Worker: prefill(i), Overlap: 4}, Prefill: 2, Cost: float64(i)})
		if i > 0 {
			p.Fallbacks = append(p.Fallbacks, i)
			p.FallbackAddresses = append(p.FallbackAddresses, fmt.Sprintf("10.0.1.%d:8000", i))
		}
	}
	d.Prefill = p
	return d
}

func prefillName(i int) string { return fmt.Sprint("p", i) }

// TestTraceOfASplitDecisionHasItsPrefillWorker: a disaggregated decision's trace names
// the prefill worker, what it holds and its candidates (chosen first, with their
// addresses), beside what the destination misses; a decision without a prefill worker
// leaves the key out and says why.
func TestTraceOfASplitDecisionHasItsPrefillWorker(t *testing.T) {
	tr := Of(split(2, plain, 3, prefillName), 0)
	assert.Equal(t, 512, tr.MissingTokens)
	assert.Empty(t, tr.DecodeOnly)
	require.NotNil(t, tr.Prefill)
	assert.Equal(t, "p0", tr.Prefill.Worker)
	assert.Equal(t, "10.0.1.0:8000", tr.Prefill.Address)
	assert.Equal(t, 64, tr.Prefill.PredictedCachedTokens)
	var workers, addresses []string
	for _, c := range tr.Prefill.Candidates {
		workers, addresses = append(workers, c.Worker), append(addresses, c.Address)
	}
	assert.Equal(t, []string{"p0", "p1", "p2"}, workers)
	assert.Equal(t, []string{"10.0.1.0:8000", "10.0.1.1:8000", "10.0.1.2:8000"}, addresses)
	assert.Equal(t, 2.0, tr.Prefill.Candidates[0].Prefill, "every term is carried")
	assert.Equal(t, "w0", tr.Worker, "the destination stays the trace's worker")
	assert.Len(t, tr.Candidates, 2)
	assert.Len(t, Of(split(2, plain, 3, prefillName), 2).Prefill.Candidates, 2, "the limit bounds the prefill candidates too")

	d := decision(2, 0, plain)
	d.DecodeOnly, d.MissingTokens = router.DecodeOnlyUnderThreshold, 7
	raw, err := HeaderValue(d)
	require.NoError(t, err)
	var top map[string]any
	require.NoError(t, json.Unmarshal(raw, &top))
	assert.NotContains(t, top, "prefill")
	assert.Equal(t, "under_threshold", top["decode_only"])
	assert.Equal(t, 7.0, top["missing_tokens"])
}

// TestHeaderValueDropsPrefillCandidatesFirst: a split decision's header over
// MaxHeaderBytes loses the prefill worker's candidates, worst first, before any of the
// destination's, and always keeps naming the prefill worker.
func TestHeaderValueDropsPrefillCandidatesFirst(t *testing.T) {
	long := func(prefix string) func(int) string {
		return func(i int) string { return fmt.Sprintf("%s-%s-%d", prefix, strings.Repeat("worker-name-", 20), i) }
	}
	tests := []struct {
		name string
		d    *router.Decision
		// wantAllDestination: the destination's candidates all fit once some prefill
		// candidates went.
		wantAllDestination bool
	}{
		{"long prefill names: only prefill candidates go", split(4, plain, MaxCandidates, long("prefill")), true},
		{"long names everywhere: the prefill list empties first", split(MaxCandidates, long("decode"), MaxCandidates, long("prefill")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			full, err := json.Marshal(Of(tt.d, MaxCandidates))
			require.NoError(t, err)
			require.Greater(t, len(full), MaxHeaderBytes, "the case needs trimming")

			raw, err := HeaderValue(tt.d)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(raw), MaxHeaderBytes)
			var tr Trace
			require.NoError(t, json.Unmarshal(raw, &tr))
			require.NotNil(t, tr.Prefill)
			assert.Equal(t, tt.d.Prefill.Worker, tr.Prefill.Worker, "the prefill worker is still named")
			kept := len(tr.Prefill.Candidates)
			assert.Equal(t, MaxCandidates-kept, tr.Prefill.Omitted)
			assert.Less(t, kept, MaxCandidates, "prefill candidates went")
			if tt.wantAllDestination {
				assert.Len(t, tr.Candidates, len(tt.d.Terms), "no destination candidate went")
				assert.Zero(t, tr.Omitted)
				require.Positive(t, kept, "only as many prefill candidates as needed went")
				assert.Equal(t, tt.d.Prefill.Worker, tr.Prefill.Candidates[0].Worker, "the worst went first")
				return
			}
			assert.Positive(t, tr.Omitted, "destination candidates went too")
			assert.Zero(t, kept, "but only once every prefill candidate had")
			assert.Equal(t, tt.d.Worker, tr.Candidates[0].Worker)
		})
	}
}
