package scoring

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tiedCandidates(n int) []Candidate {
	out := make([]Candidate, n)
	for i := range out {
		out[i] = Candidate{Worker: string(rune('a' + i))}
	}
	return out
}

func pickSequence(t *testing.T, p Picker, n int, cands []Candidate) []string {
	t.Helper()
	req := &Request{PromptTokens: 100, BlockSize: 64, Blocks: make([]uint64, 1)}
	out := make([]string, n)
	for i := range out {
		d, err := p.Pick(context.Background(), req, cands)
		require.NoError(t, err)
		out[i] = d.Worker
	}
	return out
}

func TestSeededTiesAreReproducible(t *testing.T) {
	newPicker := func(seed uint64) Picker {
		p, err := NewKVCost(DynamoParams(), rand.New(rand.NewPCG(seed, 0)))
		require.NoError(t, err)
		return p
	}
	first := pickSequence(t, newPicker(7), 50, tiedCandidates(4))
	assert.Equal(t, first, pickSequence(t, newPicker(7), 50, tiedCandidates(4)))
	assert.NotEqual(t, first, pickSequence(t, newPicker(8), 50, tiedCandidates(4)), "another seed gives another sequence")
}

func TestUnseededTiesSpreadOverEveryTiedWorker(t *testing.T) {
	p, err := NewKVCost(DynamoParams(), nil)
	require.NoError(t, err)
	seen := map[string]int{}
	for _, w := range pickSequence(t, p, 1000, tiedCandidates(4)) {
		seen[w]++
	}
	// Missing one of 4 workers in 1000 uniform draws has probability about 4·0.75^1000.
	assert.Len(t, seen, 4)
}

func TestTiesOnlyAmongTheCheapest(t *testing.T) {
	p, _ := NewKVCost(DynamoParams(), rand.New(rand.NewPCG(3, 3)))
	cands := tiedCandidates(3)
	cands[1].ActiveBlocks = 1
	for _, w := range pickSequence(t, p, 200, cands) {
		assert.NotEqual(t, "b", w)
	}
}

func TestTemperatureSamplesButFavoursCheaper(t *testing.T) {
	params := DynamoParams()
	params.Temperature = 0.5
	p, err := NewKVCost(params, rand.New(rand.NewPCG(11, 0)))
	require.NoError(t, err)
	cands := []Candidate{{Worker: "cheap"}, {Worker: "dear", ActiveBlocks: 100}}
	seen := map[string]int{}
	for _, w := range pickSequence(t, p, 2000, cands) {
		seen[w]++
	}
	// Normalised costs 0 and 1: weights 1 and e^-2, so "dear" has probability ≈ 0.119.
	assert.Greater(t, seen["dear"], 0)
	assert.Greater(t, seen["cheap"], 4*seen["dear"])
}

func TestNoCandidates(t *testing.T) {
	kv, _ := NewKVCost(DynamoParams(), nil)
	for _, p := range []Picker{kv, &RoundRobin{}, NewRandom(nil), LeastLoad{}} {
		_, err := p.Pick(context.Background(), &Request{BlockSize: 64}, nil)
		assert.ErrorIs(t, err, ErrNoCandidates)
	}
}

func TestDecisionFallbacksAndNonMaxOverlap(t *testing.T) {
	p, _ := NewKVCost(DynamoParams(), rand.New(rand.NewPCG(1, 1)))
	req := &Request{PromptTokens: 3008, BlockSize: 64, Blocks: make([]uint64, 47)}
	cands := []Candidate{
		{Worker: "holder", Overlap: 46, ActiveBlocks: 143}, // cost 144
		{Worker: "cold", ActiveBlocks: 95},                 // cost 142
		{Worker: "busy", ActiveBlocks: 200},                // cost 247
		{Worker: "half", Overlap: 20, ActiveBlocks: 120},   // cost 147
	}
	d, err := p.Pick(context.Background(), req, cands)
	require.NoError(t, err)
	assert.Equal(t, "cold", d.Worker)
	assert.Equal(t, 1, d.Chosen)
	assert.Equal(t, []int{0, 3, 2}, d.Fallbacks, "fallbacks are the rest (holder, half, busy), cheapest first")
	assert.True(t, d.NonMaxOverlap())
	assert.Equal(t, 46, d.BlocksLost)
	assert.Len(t, d.Terms, 4)
}

func TestBaselines(t *testing.T) {
	cands := []Candidate{
		{Worker: "a", ActiveRequests: 2},
		{Worker: "b", ActiveRequests: 1, PrefillTokens: 500},
		{Worker: "c", ActiveRequests: 1, PrefillTokens: 100},
	}
	t.Run("round robin cycles in candidate order from its zero value", func(t *testing.T) {
		var rr RoundRobin
		assert.Equal(t, []string{"a", "b", "c", "a"}, pickSequence(t, &rr, 4, cands))
		d, _ := rr.Pick(context.Background(), &Request{BlockSize: 64}, cands) // "b"
		assert.Equal(t, []int{2, 0}, d.Fallbacks, "c, then a")
	})
	t.Run("least load takes fewest requests then fewest prefill tokens", func(t *testing.T) {
		assert.Equal(t, []string{"c"}, pickSequence(t, LeastLoad{}, 1, cands))
	})
	t.Run("random with a seed is reproducible", func(t *testing.T) {
		a := pickSequence(t, NewRandom(rand.New(rand.NewPCG(5, 5))), 20, cands)
		assert.Equal(t, a, pickSequence(t, NewRandom(rand.New(rand.NewPCG(5, 5))), 20, cands))
	})
}

func TestGIEBaselineWeighsPrefixQueueAndKVUsage(t *testing.T) {
	g := NewGIE(rand.New(rand.NewPCG(1, 1)))
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	tests := []struct {
		name  string
		cands []Candidate
		want  string
	}{
		{"full prefix beats an idle cold worker", []Candidate{{Worker: "cold"}, {Worker: "holder", Overlap: 10, Waiting: 3, KVUtilization: 0.2}}, "holder"},
		{"a deep queue outweighs a half prefix", []Candidate{{Worker: "cold"}, {Worker: "half", Overlap: 5, Waiting: 9, KVUtilization: 0.5}}, "cold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := g.Pick(context.Background(), req, tt.cands)
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker)
		})
	}
}

// GIE's lora-affinity scorer, added at weight 1: the engine running the adapter beats
// one with a slot free, which beats one where the adapter waits, which beats a full
// one; without the scorer the engines' LoRA states change nothing.
func TestGIEWithLoRAPrefersTheEngineRunningTheAdapter(t *testing.T) {
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	tests := []struct {
		name  string
		cands []Candidate
		want  string
	}{
		{"running beats a free slot", []Candidate{{Worker: "free", EngineLoRA: LoRASlotFree}, {Worker: "running", EngineLoRA: LoRARunning}}, "running"},
		{"a free slot beats a queued adapter", []Candidate{{Worker: "queued", EngineLoRA: LoRAQueued}, {Worker: "free", EngineLoRA: LoRASlotFree}}, "free"},
		{"queued beats full", []Candidate{{Worker: "full", EngineLoRA: LoRAFull}, {Worker: "queued", EngineLoRA: LoRAQueued}}, "queued"},
		{"a full prefix still beats the adapter's affinity", []Candidate{{Worker: "running", EngineLoRA: LoRARunning}, {Worker: "holder", Overlap: 10, EngineLoRA: LoRAFull}}, "holder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewGIEWithLoRA(rand.New(rand.NewPCG(1, 1)), 1).Pick(context.Background(), req, tt.cands)
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker)
		})
	}
	d, err := NewGIE(rand.New(rand.NewPCG(1, 1))).Pick(context.Background(), req,
		[]Candidate{{Worker: "full", EngineLoRA: LoRAFull}, {Worker: "running", EngineLoRA: LoRARunning}})
	require.NoError(t, err)
	assert.Equal(t, d.Terms[0].Cost, d.Terms[1].Cost, "the default profile has no LoRA score")
}
