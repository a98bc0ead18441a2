package sim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
)

func ids(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	require.NoError(t, err)
	return e
}

// pass runs one pass starting at now and returns its duration and results.
func pass(t *testing.T, e *Engine, now time.Duration) (time.Duration, []Output, []Event) {
	t.Helper()
	d, ok, err := e.StartPass(now)
	require.NoError(t, err)
	require.True(t, ok, "a pass was scheduled")
	outs, events := e.EndPass(now + d)
	return d, outs, events
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func TestPassTimes(t *testing.T) {
	cfg := Config{NumGPUBlocks: 100, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 8192}
	e := newEngine(t, cfg)
	require.NoError(t, e.Add(&Request{ID: 1, Prompt: ids(0, 100), Output: ids(900, 3)}))

	// Prefill of 100 tokens: 4.209989e-7·100² + 1.518344e-2·100 + 16.50142 = 18.02397 ms.
	d, outs, _ := pass(t, e, 0)
	assert.InDelta(t, 18.02397, float64(d)/1e6, 1e-4)
	require.Len(t, outs, 1)
	assert.True(t, outs[0].FirstToken)

	// A decode pass: 7 blocks held of 100 (u = 0.07): −25.74·0.0049 + 54.01·0.07 + 5.74 = 9.394574 ms.
	d, outs, _ = pass(t, e, d)
	assert.InDelta(t, 9.394574, float64(d)/1e6, 1e-4)
	assert.False(t, outs[0].FirstToken)
	assert.False(t, outs[0].Finished)
}

func TestChunkedPrefillWithinTheTokenBudget(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 1000, BlockSize: 64, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	require.NoError(t, e.Add(&Request{ID: 1, Prompt: ids(0, 10000), Output: ids(0, 1)}))
	d1, outs, _ := pass(t, e, 0)
	assert.Empty(t, outs, "first chunk: no token yet")
	assert.InDelta(t, 4.209989e-7*8192*8192+1.518344e-2*8192+16.50142, float64(d1)/1e6, 1e-3)
	d2, outs, _ := pass(t, e, d1)
	assert.InDelta(t, 4.209989e-7*1808*1808+1.518344e-2*1808+16.50142, float64(d2)/1e6, 1e-3)
	require.Len(t, outs, 1)
	assert.True(t, outs[0].FirstToken && outs[0].Finished)
	assert.Equal(t, 10000, e.PrefillTokens)
}

func TestPrefixCacheServesLeadingBlocks(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	a := &Request{ID: 1, Prompt: ids(0, 64), Output: ids(500, 1)}
	require.NoError(t, e.Add(a))
	_, _, events := pass(t, e, 0)
	require.Len(t, events, 1)
	assert.Len(t, events[0].Hashes, 4, "4 full blocks stored at the end of the pass")
	assert.Equal(t, 0, a.CachedTokens)

	// The same 64-token prompt: at most 63 tokens can come from cache, so 3 blocks.
	b := &Request{ID: 2, Prompt: ids(0, 64), Output: ids(500, 1)}
	require.NoError(t, e.Add(b))
	pass(t, e, time.Second)
	assert.Equal(t, 48, b.CachedTokens)
	assert.Equal(t, 16, b.RecomputedTokens)

	// A prompt that diverges in its third block reuses two.
	c := &Request{ID: 3, Prompt: append(ids(0, 40), ids(7000, 40)...), Output: ids(500, 1)}
	require.NoError(t, e.Add(c))
	pass(t, e, 2*time.Second)
	assert.Equal(t, 32, c.CachedTokens)
	assert.Equal(t, 64+16+48, e.RecomputedTokens)
}

func TestOutputTokensAreCachedForTheNextTurn(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	turn1 := &Request{ID: 1, Prompt: ids(0, 8), Output: ids(100, 5)}
	require.NoError(t, e.Add(turn1))
	now := time.Duration(0)
	for !turn1.Done() {
		d, _, _ := pass(t, e, now)
		now += d
	}
	// KV exists for the prompt and the first 4 outputs (12 tokens, 3 blocks).
	next := append(append(ids(0, 8), ids(100, 5)...), ids(200, 7)...)
	turn2 := &Request{ID: 2, Prompt: next, Output: ids(300, 1)}
	require.NoError(t, e.Add(turn2))
	pass(t, e, now)
	assert.Equal(t, 12, turn2.CachedTokens)
}

func TestEvictionIsLeastRecentlyUsedLeavesFirst(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 8, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	a := &Request{ID: 1, Prompt: ids(0, 16), Output: ids(90, 1)}
	require.NoError(t, e.Add(a))
	_, _, evA := pass(t, e, 0)
	b := &Request{ID: 2, Prompt: ids(100, 16), Output: ids(90, 1)}
	require.NoError(t, e.Add(b))
	pass(t, e, time.Second)
	assert.Equal(t, 8, e.CachedBlocks())

	// 8 tokens need 2 new blocks: A's (older) deepest two go.
	c := &Request{ID: 3, Prompt: ids(200, 8), Output: ids(90, 1)}
	require.NoError(t, e.Add(c))
	_, _, events := pass(t, e, 2*time.Second)
	require.NotEmpty(t, events)
	require.False(t, events[0].Stored)
	assert.ElementsMatch(t, evA[0].Hashes[2:], events[0].Hashes)

	// A's first two blocks are still cached.
	again := &Request{ID: 4, Prompt: ids(0, 16), Output: ids(90, 1)}
	require.NoError(t, e.Add(again))
	pass(t, e, 3*time.Second)
	assert.Equal(t, 8, again.CachedTokens)
}

func TestMaxNumSeqsAndFIFOAdmission(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: 4, MaxNumSeqs: 2, MaxBatchedTokens: 8192})
	for i := range 3 {
		require.NoError(t, e.Add(&Request{ID: i, Prompt: ids(i*100, 8), Output: ids(0, 2)}))
	}
	pass(t, e, 0)
	assert.Equal(t, 2, e.Running())
	assert.Equal(t, 1, e.Waiting())
}

func TestPreemptionOfTheNewestRunningRequest(t *testing.T) {
	// 6 blocks of 4 tokens. Two requests of 8 prompt tokens each take 4 blocks and
	// decode; when both need a third block, only one more... then the newest is preempted.
	e := newEngine(t, Config{NumGPUBlocks: 5, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	old := &Request{ID: 1, Prompt: ids(0, 8), Output: ids(50, 8)}
	young := &Request{ID: 2, Prompt: ids(100, 8), Output: ids(60, 8)}
	require.NoError(t, e.Add(old))
	require.NoError(t, e.Add(young))
	now := time.Duration(0)
	for young.Preemptions == 0 {
		d, _, _ := pass(t, e, now)
		now += d
		require.Less(t, now, time.Minute, "no preemption happened")
	}
	assert.Equal(t, 0, old.Preemptions, "the newest request is the one preempted")
	assert.Equal(t, 1, e.Waiting())
	for !(old.Done() && young.Done()) {
		d, _, _ := pass(t, e, now)
		now += d
	}
	assert.Greater(t, young.PreemptedTokens, 0, "the preempted request was recomputed")
	assert.True(t, e.Idle())
}

func TestRejectsRequestsItCannotServe(t *testing.T) {
	e := newEngine(t, DefaultConfig())
	assert.Error(t, e.Add(&Request{ID: 1, Output: ids(0, 1)}))
	assert.Error(t, e.Add(&Request{ID: 2, Prompt: ids(0, 1)}))
	_, err := New(Config{})
	assert.Error(t, err)
}

func TestAbortReleasesBlocks(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 10, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	r := &Request{ID: 1, Prompt: ids(0, 16), Output: ids(50, 10)}
	waiting := &Request{ID: 2, Prompt: ids(100, 40), Output: ids(50, 1)}
	require.NoError(t, e.Add(r))
	pass(t, e, 0)
	require.NoError(t, e.Add(waiting))
	assert.True(t, e.Abort(waiting, time.Second))
	assert.True(t, e.Abort(r, time.Second))
	assert.False(t, e.Abort(r, time.Second))
	assert.True(t, e.Idle())
	assert.Equal(t, 0.0, e.KVUsage(), "every block is free or idle in the cache")
}

func TestAbortDuringAPassFreesTheBlocksAtItsEnd(t *testing.T) {
	// A live server sleeps through a pass without its lock, so a client can go away
	// while the pass computes its request.
	e := newEngine(t, Config{NumGPUBlocks: 10, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	gone := &Request{ID: 1, Prompt: ids(0, 16), Output: ids(50, 10)}
	stays := &Request{ID: 2, Prompt: ids(100, 8), Output: ids(60, 2)}
	require.NoError(t, e.Add(gone))
	require.NoError(t, e.Add(stays))
	d, ok, err := e.StartPass(0)
	require.NoError(t, err)
	require.True(t, ok)

	assert.True(t, e.Abort(gone, d/2))
	assert.False(t, e.Abort(gone, d/2), "aborted once")
	outs, events := e.EndPass(d)
	require.Len(t, outs, 1, "nothing is emitted for the aborted request")
	assert.Equal(t, stays, outs[0].Request)
	for _, ev := range events {
		assert.NotEqual(t, gone.ID, ev.Request, "nor stored")
	}
	assert.Equal(t, 1, e.Running())
	for !e.Idle() {
		pass(t, e, time.Second)
	}
	assert.Equal(t, 0.0, e.KVUsage(), "its blocks were freed")
}

func TestStoredEventsCarryTheirParentTokensAndAdapter(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 32})
	r := &Request{ID: 1, Salt: 7, LoRA: "sql", Prompt: ids(0, 80), Output: ids(500, 1)}
	require.NoError(t, e.Add(r))
	var stored []Event
	now := time.Duration(0)
	for !e.Idle() {
		d, _, events := pass(t, e, now)
		now += d
		stored = append(stored, events...)
	}
	require.Len(t, stored, 3, "a 32-token budget computes two blocks a pass")
	var chain []uint64
	for _, ev := range stored {
		assert.Equal(t, "sql", ev.LoRA, "each store names the request's adapter")
		assert.Equal(t, len(chain) > 0, ev.HasParent)
		if ev.HasParent {
			assert.Equal(t, chain[len(chain)-1], ev.Parent)
		}
		chain = index.ChainHashes(chain, ev.Parent, ev.HasParent, ev.Tokens, 16, 7)
	}
	assert.Equal(t, index.BlockHashes(nil, ids(0, 80), 16, 7), chain, "the events' tokens rebuild the engine's chain")
}

func TestPassListsItsChunksAndAdmissionTimes(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 1000, BlockSize: 64, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	a := &Request{ID: 1, Prompt: ids(0, 6000), Output: ids(900, 2)}
	b := &Request{ID: 2, Prompt: ids(10_000, 3000), Output: ids(900, 2)}
	require.NoError(t, e.Add(a))
	require.NoError(t, e.Add(b))

	d, _, _ := pass(t, e, ms(5))
	// Both admitted in the first pass; b gets what is left of the 8,192-token budget.
	assert.Equal(t, []Chunk{{Request: a, Tokens: 6000}, {Request: b, Tokens: 2192}}, e.Pass(), "between passes: the last one")
	assert.Equal(t, ms(5), a.AdmittedAt)
	assert.Equal(t, ms(5), b.AdmittedAt)

	_, ok, err := e.StartPass(ms(5) + d)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []Chunk{{Request: a, Tokens: 1, Decode: true}, {Request: b, Tokens: 808}}, e.Pass(), "during a pass: the pass under way")
	assert.Equal(t, ms(5), b.AdmittedAt, "admission time is the first admission's")
}

// With max_loras 1, an adapter request waits while another adapter runs, keeps its
// place, and is passed over by the requests behind it that can run: those of the
// running adapter and of the base model (vLLM's scheduler skips it the same way).
func TestMaxLoRAsPassesOverAnotherAdaptersRequest(t *testing.T) {
	tests := []struct {
		name       string
		maxLoRAs   int
		wantFirst  []int // requests admitted by the first pass
		wantSecond []int // admitted once the first pass's requests have finished
	}{
		{"no limit", 0, []int{1, 2, 3, 4}, nil},
		{"one adapter at a time", 1, []int{1, 3, 4}, []int{2}},
		{"two adapters", 2, []int{1, 2, 3, 4}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 1024, MaxLoRAs: tt.maxLoRAs})
			reqs := []*Request{
				{ID: 1, LoRA: "a", Prompt: ids(0, 32), Output: ids(900, 1)},
				{ID: 2, LoRA: "b", Prompt: ids(100, 32), Output: ids(900, 1)},
				{ID: 3, LoRA: "a", Prompt: ids(200, 32), Output: ids(900, 1)},
				{ID: 4, Prompt: ids(300, 32), Output: ids(900, 1)},
			}
			for _, r := range reqs {
				require.NoError(t, e.Add(r))
			}
			admitted := func(now time.Duration) []int {
				d, ok, err := e.StartPass(now)
				require.NoError(t, err)
				require.True(t, ok)
				var got []int
				for _, c := range e.Pass() {
					got = append(got, c.Request.ID)
				}
				e.EndPass(now + d)
				return got
			}
			running, waiting := e.Adapters()
			assert.Empty(t, running)
			assert.Equal(t, []string{"a", "b"}, waiting, "each adapter once, the base model none")
			assert.Equal(t, tt.wantFirst, admitted(0))
			assert.Equal(t, len(tt.wantSecond), e.Waiting())
			if tt.wantSecond != nil {
				assert.Equal(t, tt.wantSecond, admitted(time.Second), "it runs once its adapter can")
			}
		})
	}
}

// Random adapter workloads under memory pressure: at every pass the running set keeps
// to max_num_seqs and max_loras, and the requests still waiting keep their order
// (preempted ones go to the head). The runs must both preempt and admit past the
// queue's head, or they test neither.
func TestMaxLoRAsKeepsItsBoundsAndTheQueuesOrder(t *testing.T) {
	preemptions, passedOver := 0, 0
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := Config{NumGPUBlocks: 24 + rng.IntN(20), BlockSize: 4, MaxNumSeqs: 1 + rng.IntN(5), MaxBatchedTokens: 8 + rng.IntN(64), MaxLoRAs: 1 + rng.IntN(3)}
		e := newEngine(t, cfg)
		var all []*Request
		loras := []string{"", "a", "b", "c", "d"}
		now := time.Duration(0)
		for step := 0; step < 400; step++ {
			if rng.IntN(3) == 0 && len(all) < 60 {
				r := &Request{ID: len(all) + 1, LoRA: loras[rng.IntN(len(loras))], Prompt: ids(rng.IntN(3)*1000+len(all)*7, 4+rng.IntN(40)), Output: ids(900, 1+rng.IntN(8))}
				all = append(all, r)
				require.NoError(t, e.Add(r))
			}
			before := slices.Clone(e.waiting)
			d, ok, err := e.StartPass(now)
			require.NoError(t, err)
			if !ok {
				now += time.Millisecond
				continue
			}
			require.LessOrEqual(t, len(e.running), cfg.MaxNumSeqs)
			if len(before) > 0 && slices.Contains(e.waiting, before[0]) && len(e.waiting) < len(before) {
				passedOver++
			}
			running, _ := e.Adapters()
			require.LessOrEqual(t, len(running), cfg.MaxLoRAs, "seed %d step %d", seed, step)
			var kept, still []*Request
			for _, r := range before {
				if slices.Contains(e.waiting, r) {
					kept = append(kept, r)
				}
			}
			for _, r := range e.waiting {
				if slices.Contains(before, r) {
					still = append(still, r)
				}
			}
			require.Equal(t, kept, still, "seed %d step %d: first in, first out", seed, step)
			e.EndPass(now + d)
			now += d
		}
		for _, r := range all {
			preemptions += r.Preemptions
		}
	}
	assert.Positive(t, preemptions)
	assert.Positive(t, passedOver)
}

func TestPreemptionMidPrefillCountsOnlyTheTokensComputedAgain(t *testing.T) {
	// 5 blocks of 4 tokens, 4 tokens a pass: old (11 prompt tokens) decodes and grows
	// while young (8) computes its prompt in chunks, and young is preempted with half
	// of its prompt computed. Its first admission counted all 8 prompt tokens in
	// RecomputedTokens; admitted again, it computes 8 tokens, of which only the 4 it
	// had computed are recomputed. Every prefill token computed is counted once, in
	// RecomputedTokens or in PreemptedTokens.
	e := newEngine(t, Config{NumGPUBlocks: 5, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 4})
	old := &Request{ID: 1, Prompt: ids(0, 11), Output: ids(50, 10)}
	young := &Request{ID: 2, Prompt: ids(100, 8), Output: ids(60, 2)}
	require.NoError(t, e.Add(old))
	require.NoError(t, e.Add(young))
	now := time.Duration(0)
	computedAtPreemption := -1
	for !e.Idle() {
		before := young.computed
		d, _, _ := pass(t, e, now)
		now += d
		if young.Preemptions == 1 && computedAtPreemption < 0 {
			computedAtPreemption = before
		}
		require.Less(t, now, time.Minute)
	}
	require.Equal(t, 1, young.Preemptions)
	require.Equal(t, 4, computedAtPreemption, "young was preempted with half its prompt computed")
	assert.Equal(t, 4, young.PreemptedTokens)
	assert.Equal(t, e.PrefillTokens, e.RecomputedTokens+old.PreemptedTokens+young.PreemptedTokens)
}
