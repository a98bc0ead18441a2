package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCostTableOfCorners pins hand-computed costs (README "The cost", DESIGN §3)
// for the corner cases of a review: zero blocks, overlap = prompt, overlap > prompt, a
// prompt shorter than a block, capacity 0, max_num_seqs set and unset, LoRA.
func TestCostTableOfCorners(t *testing.T) {
	dyn := DynamoParams()
	tests := []struct {
		name   string
		p      Params
		isl    int
		c      Candidate
		shared int // SharedPrefixBlocks
		want   float64
	}{
		// R = 0: prefill = 32/16 = 2; D 5; a·N = 2; q·W = 64; α and β charge nothing.
		{"empty prompt", Params{OverlapCredit: 1, PrefillLoadScale: 1, ActiveRequestWeight: 1, PrefixAffinityWeight: 4, CachePressureWeight: 32, QueueWeight: 64, FloorPrefill: true},
			0, Candidate{PrefillTokens: 32, ActiveBlocks: 5, ActiveRequests: 2, PendingRequests: 1, HeldBlocks: 8, CapacityBlocks: 16}, 0, 2 + 5 + 2 + 64},
		// isl 64, bs 16: R = F = 4, ov 4: prefill 4 − 4 = 0; D 4.
		{"overlap = prompt", withAffinity(dyn, 4), 64, Candidate{Overlap: 4, ActiveBlocks: 4}, 0, 4},
		// ov 6 > R 4: prefill 4 − 6 = −2 → 0 floored; α·max(0, 4 − 6) = 0.
		{"overlap > prompt, floored", withAffinity(dyn, 4), 64, Candidate{Overlap: 6, ActiveBlocks: 4, NewBlocks: 1}, 0, 5},
		{"overlap > prompt, unfloored", Params{OverlapCredit: 1, PrefillLoadScale: 1, PrefixAffinityWeight: 4}, 64, Candidate{Overlap: 6, ActiveBlocks: 4, NewBlocks: 1}, 0, 3},
		// isl 10 < bs 16: R = 1, F = 0; prefill 10/16; α·1 = 4; β·1·8/16 = 16.
		{"prompt shorter than a block", Params{OverlapCredit: 1, PrefillLoadScale: 1, PrefixAffinityWeight: 4, CachePressureWeight: 32, FloorPrefill: true},
			10, Candidate{HeldBlocks: 8, CapacityBlocks: 16}, 0, 0.625 + 4 + 16},
		// Capacity 0 (unknown): neither β nor μ charges, whatever is held.
		{"capacity unknown", Params{OverlapCredit: 1, PrefillLoadScale: 1, CachePressureWeight: 32, MemoryWeight: 10, FloorPrefill: true},
			64, Candidate{HeldBlocks: 100, ActiveBlocks: 50, NewBlocks: 4}, 0, 4 + 50 + 4},
		// Capacity 40: μ·max(0, 50 + 4 − 40) = 10·14; β·4·min(1, 100/40) = 128.
		{"capacity known", Params{OverlapCredit: 1, PrefillLoadScale: 1, CachePressureWeight: 32, MemoryWeight: 10, FloorPrefill: true},
			64, Candidate{HeldBlocks: 100, CapacityBlocks: 40, ActiveBlocks: 50, NewBlocks: 4}, 0, 4 + 50 + 4 + 140 + 128},
		// S unset: Q = W = 1. S = 4, N = 5: Q = max(1, 5 + 1 − 4) = 2.
		{"max_num_seqs unset", Params{QueueWeight: 64}, 0, Candidate{ActiveRequests: 5, PendingRequests: 1}, 0, 64},
		{"max_num_seqs set", Params{QueueWeight: 64}, 0, Candidate{ActiveRequests: 5, PendingRequests: 1, MaxNumSeqs: 4}, 0, 128},
		{"max_num_seqs set, slots free", Params{QueueWeight: 64}, 0, Candidate{ActiveRequests: 1, PendingRequests: 0, MaxNumSeqs: 4}, 0, 0},
		// LoRA: λ·B.
		{"lora blocked", Params{LoRAWeight: 1024}, 0, Candidate{LoRABlocked: 2.5}, 0, 2560},
		// h = 0, H = 3, ov 1, R 4: shared = min(3, 2) = 2; α charges 3 − 2 = 1.
		{"shared prefix", Params{PrefixAffinityWeight: 4}, 64, Candidate{Overlap: 1}, 3, 4},
		// u = 0.5, o = 2: prefill 4 − (1 + 1) = 2; α charges 3 − 1 = 2 → 8.
		{"offloaded", Params{OverlapCredit: 1, PrefillLoadScale: 1, PrefixAffinityWeight: 4, SharedPrefixAffinity: 1, OffloadCredit: 0.5, FloorPrefill: true}, 64, Candidate{Overlap: 1, OffloadedBlocks: 2}, 0, 2 + 8},
		// σ = 2, R = 4: −8.
		{"session credit", Params{SessionAffinityWeight: 2}, 64, Candidate{SessionWorker: true}, 0, -8},
		// ι·N·(R − ov) = 0.5·4·3 = 6.
		{"interference", Params{InterferenceWeight: 0.5}, 64, Candidate{Overlap: 1, ActiveRequests: 4}, 0, 6},
		// ω·H/bs: 320 tokens one half-life ago: 160/16·2 = 20.
		{"history", Params{PrefillHistoryWeight: 2, PrefillHistoryHalfLife: 30}, 0, Candidate{PrefillHistory: 320, PrefillHistoryAge: 30 * time.Second}, 0, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &Request{PromptTokens: tt.isl, BlockSize: 16, Blocks: make([]uint64, tt.isl/16), SharedPrefixBlocks: tt.shared}
			got := tt.p.Cost(req, tt.c)
			assert.InDelta(t, tt.want, got.Cost, 1e-9)
			assert.False(t, math.IsNaN(got.Cost) || math.IsInf(got.Cost, 0))
		})
	}
}

// TestLoRASlotsThroughTheLedger prices B(w) through Bookings.Fill: with and without
// slots, slots free and full.
func TestLoRASlotsThroughTheLedger(t *testing.T) {
	b := NewBookings()
	b.BookAdapter("w", "x", nil, 0)
	b.BookAdapter("w", "x", nil, 0)
	b.BookAdapter("w", "x", nil, 0)
	for _, tt := range []struct {
		slots int
		lora  string
		want  float64
	}{
		{0, "y", 0},   // slots unknown
		{2, "y", 1},   // (1 + 1)/2
		{4, "y", 0.5}, // (1 + 1)/4
		{1, "y", 4},   // full: 1 + 3 requests of x
		{1, "x", 0},   // runs there
		{1, "", 0},    // base model
	} {
		c := []Candidate{{Worker: "w", MaxLoRAs: tt.slots}}
		b.Fill(c, nil, tt.lora)
		require.Equal(t, tt.want, c[0].LoRABlocked, "slots %d lora %q", tt.slots, tt.lora)
	}
}
