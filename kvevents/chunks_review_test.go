package kvevents

// Review of the host tiers' second pass (helper-47): each case failed before its fix.

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
)

// With index.approximate_offload, the batch that brings a worker into event mode has
// its host stores applied while the worker is approximate; SetMode(events) then clears
// the offloaded part, the engine's reported blocks with the guesses. The applier
// still maps them, and an engine that never resends (LMCache) never reports them again.
func TestTheFirstBatchsHostBlocksSurviveEventMode(t *testing.T) {
	for _, guess := range []bool{false, true} {
		h := newHarnessOver(t, index.Config{CapacityBlocks: 1000, TTL: time.Minute, PendingTTL: time.Second, ApproximateOffload: guess}, DefaultConfig(),
			WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: 1, MaxEntries: 2000})
		idx := h.idx
		p := toks(0, 8*testBS)
		h.apply(0, chunk(700, 0, p[:4*testBS]), chunk(701, 700, p[4*testBS:]))
		require.Equal(t, index.ModeEvents, idx.Mode("w"))
		_, run := h.offloaded(p)
		assert.Equal(t, 8, run, "approximate_offload %v", guess)
	}
}

// Chunks of prompts that differ inside one (fix 1's case) share blocks: the map counts
// each mapping's blocks, the index each block once, so the map can exceed 3/4 of its
// bound (twice the index's) with nothing evicted, and every overflow clears it all.
func TestPruneCountsSharedChunkBlocksOnce(t *testing.T) {
	h := newHarnessOver(t, index.Config{CapacityBlocks: 2, TTL: time.Minute, PendingTTL: time.Second}, DefaultConfig(), // 8 offloaded blocks
		WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: 1, MaxEntries: 4, MaxOffloaded: 16})
	idx := h.idx
	shared := toks(0, 3*testBS)
	var prompts [][]uint32
	for i := range 5 {
		prompt := append(slices.Clone(shared), toks(10_000*(i+1), testBS)...)
		prompts = append(prompts, prompt)
		h.apply(0, chunk(uint64(700+i), 0, prompt))
	}
	_, run := h.offloaded(prompts[4])
	assert.Equal(t, 4, run, "the newest chunk; index holds %d of 8", idx.OffloadedEntries("w"))
	assert.Zero(t, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonOverflow)), "the index evicted nothing: 8 distinct blocks in 8")
}
