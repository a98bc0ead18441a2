package sim

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
)

// workloadDigest runs a seeded workload of plain requests (shared prefixes, chunked
// prefills, preemptions) and digests every pass: its duration, chunks, outputs and
// events, and the requests' outcomes and the engine's counters at the end. It returns
// the digest and the workload's preemptions and cached tokens, which must not be 0.
// hostBlocks sizes the engine's host tier.
func workloadDigest(t *testing.T, hostBlocks int) (digest uint64, preemptions, cached int) {
	t.Helper()
	e := newEngine(t, Config{NumGPUBlocks: 40, BlockSize: 4, MaxNumSeqs: 4, MaxBatchedTokens: 48, HostBlocks: hostBlocks})
	rng := rand.New(rand.NewPCG(1, 2))
	h := fnv.New64a()
	var all []*Request
	now := time.Duration(0)
	for step := 0; step < 500; step++ {
		if rng.IntN(3) == 0 && len(all) < 80 {
			prompt := append(ids(rng.IntN(3)*1000, 8+rng.IntN(24)), ids(5000+len(all)*50, 1+rng.IntN(30))...)
			r := &Request{ID: len(all) + 1, Prompt: prompt, Output: ids(900+len(all), 1+rng.IntN(40))}
			all = append(all, r)
			require.NoError(t, e.Add(r))
		}
		d, ok, err := e.StartPass(now)
		require.NoError(t, err)
		if !ok {
			now += time.Millisecond
			continue
		}
		fmt.Fprintln(h, "pass", d)
		for _, c := range e.Pass() {
			fmt.Fprintln(h, "chunk", c.Request.ID, c.Tokens, c.Decode)
		}
		outs, events := e.EndPass(now + d)
		now += d
		for _, o := range outs {
			fmt.Fprintln(h, "out", o.Request.ID, o.FirstToken, o.Finished)
		}
		for _, ev := range events {
			fmt.Fprintln(h, "event", ev.Stored, ev.Request, ev.Hashes, ev.Parent, ev.HasParent, ev.Tokens)
		}
	}
	for _, r := range all {
		preemptions += r.Preemptions
		cached += r.CachedTokens
		fmt.Fprintln(h, "request", r.ID, r.CachedTokens, r.RecomputedTokens, r.PreemptedTokens, r.Preemptions, r.Generated, r.AdmittedAt)
	}
	fmt.Fprintln(h, "engine", e.PromptTokens, e.RecomputedTokens, e.PrefillTokens, e.Passes)
	return h.Sum64(), preemptions, cached
}

// A request without Transferred is scheduled, timed and counted as before transfers
// existed: the digest is the one the engine gave then (commit 25e7f13), but for its
// requests' PreemptedTokens, which no longer count prompt tokens a preemption came
// before (TestPreemptionMidPrefillCountsOnlyTheTokensComputedAgain).
func TestPlainRequestsAreUnchangedByTransfers(t *testing.T) {
	digest, preemptions, cached := workloadDigest(t, 0)
	require.Positive(t, preemptions, "the workload preempts")
	require.Positive(t, cached, "the workload hits the cache")
	assert.Equal(t, uint64(plainWorkloadDigest), digest)
}

// plainWorkloadDigest is workloadDigest's without a host tier.
const plainWorkloadDigest = 0x1a06f78d573360dd

func TestTransferTime(t *testing.T) {
	tests := []struct {
		name   string
		tokens int
		want   time.Duration
	}{
		{"nothing to read: the fixed part", 0, 2 * time.Millisecond},
		{"one token", 1, 2*time.Millisecond + 5*time.Microsecond},
		{"a 1,000-token prompt", 1000, 7 * time.Millisecond},
		{"a negative count is none", -3, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, TransferTime(tt.tokens))
		})
	}
}

// decodeTime is the pass-time model's decode part alone, at KV usage u.
func decodeTime(u float64) time.Duration {
	return ms(max(1, -25.74*u*u+54.01*u+5.74))
}

// A transferred request loads what its own cache lacks of the prompt but the last
// token, and its first pass computes that token alone, as a decode: no prefill part in
// the pass's time and no prefill tokens. The loaded full blocks are stored at the pass's
// end, with their BlockStored events.
func TestTransferredRequestLoadsItsPromptAndDecodes(t *testing.T) {
	const bs = 16
	tests := []struct {
		name            string
		warm            []uint32 // a plain request's prompt run first, to cache its blocks
		prompt          []uint32
		wantCached      int
		wantTransferred int
		wantStored      []uint64 // hashes of the blocks the transferred request's pass stores
	}{
		{"cold cache", nil, ids(0, 100), 0, 99, blockHashes(ids(0, 96), bs)},
		{"whole blocks", nil, ids(0, 64), 0, 63, blockHashes(ids(0, 64), bs)},
		{"local hits load less", ids(0, 48), ids(0, 100), 48, 51, blockHashes(ids(0, 96), bs)[3:]},
		{"all cached but the last token", ids(0, 64), ids(0, 65), 64, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
			var warmed *Request
			if tt.warm != nil {
				warmed = &Request{ID: 1, Prompt: tt.warm, Output: ids(900, 1)}
				require.NoError(t, e.Add(warmed))
				pass(t, e, 0)
				require.True(t, e.Idle())
			}
			prefill := e.PrefillTokens
			r := &Request{ID: 2, Prompt: tt.prompt, Output: ids(700, 3), Transferred: true}
			require.NoError(t, e.Add(r))
			d, outs, events := pass(t, e, time.Second)

			require.Len(t, outs, 1)
			assert.True(t, outs[0].FirstToken, "the first token after one pass")
			assert.Equal(t, []Chunk{{Request: r, Tokens: 1, Decode: true}}, e.Pass())
			blocks := ceilDiv(len(tt.prompt), bs)
			assert.Equal(t, decodeTime(float64(blocks)/100), d, "a decode pass holding the whole sequence's blocks")
			assert.Equal(t, prefill, e.PrefillTokens, "nothing computed as prefill")

			assert.Equal(t, tt.wantCached, r.CachedTokens)
			assert.Equal(t, tt.wantTransferred, r.TransferredTokens)
			assert.Equal(t, 1, r.RecomputedTokens, "the last prompt token is computed")
			assert.Equal(t, len(tt.prompt), r.CachedTokens+r.TransferredTokens+r.RecomputedTokens)
			assert.Equal(t, tt.wantTransferred, e.TransferredTokens)
			wantRecomputed := 1
			if warmed != nil {
				wantRecomputed += warmed.RecomputedTokens
			}
			assert.Equal(t, wantRecomputed, e.RecomputedTokens, "the engine's counter sums the requests'")

			var stored []uint64
			for _, ev := range events {
				require.True(t, ev.Stored)
				assert.Equal(t, r.ID, ev.Request)
				stored = append(stored, ev.Hashes...)
			}
			assert.Equal(t, tt.wantStored, stored)

			for !r.Done() {
				_, outs, _ = pass(t, e, 2*time.Second)
				assert.Equal(t, []Chunk{{Request: r, Tokens: 1, Decode: true}}, e.Pass())
			}
			assert.True(t, e.Idle())
		})
	}
}

func blockHashes(tokens []uint32, bs int) []uint64 {
	return index.BlockHashes(nil, tokens, bs, 0)
}

// A transferred request preempted after its transfer is recomputed when admitted
// again, as a prefill: the transfer happened once.
func TestPreemptedTransferredRequestRecomputes(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 5, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	old := &Request{ID: 1, Prompt: ids(0, 8), Output: ids(50, 8)}
	young := &Request{ID: 2, Prompt: ids(100, 8), Output: ids(60, 8), Transferred: true}
	require.NoError(t, e.Add(old))
	require.NoError(t, e.Add(young))
	now := time.Duration(0)
	readmitted := false
	for !(old.Done() && young.Done()) {
		preempted := young.Preemptions > 0 && !slices.Contains(e.running, young)
		d, _, _ := pass(t, e, now)
		now += d
		for _, c := range e.Pass() {
			if c.Request == young && preempted {
				readmitted = true
				assert.False(t, c.Decode, "readmitted: its prompt is computed again")
			}
		}
		require.Less(t, now, time.Minute)
	}
	require.Equal(t, 1, young.Preemptions)
	assert.True(t, readmitted)
	assert.Equal(t, 7, young.TransferredTokens, "transferred at first admission only")
	assert.Equal(t, 7, e.TransferredTokens)
	assert.Positive(t, young.PreemptedTokens)
	assert.Equal(t, 8+young.PreemptedTokens, e.PrefillTokens, "old's prompt and young's recompute")
}

// CachedPrefixTokens finds the tokens admission then finds in the cache.
func TestCachedPrefixTokensIsWhatAdmissionFinds(t *testing.T) {
	const bs = 16
	tests := []struct {
		name   string
		prompt []uint32
		salt   uint64
		want   int
	}{
		{"a longer prompt: the cached blocks", ids(0, 100), 0, 64},
		{"the same prompt: its last token is computed", ids(0, 64), 0, 48},
		{"diverging in the second block", append(ids(0, 20), ids(9000, 40)...), 0, 16},
		{"another salt", ids(0, 100), 7, 0},
		{"a prompt of one token", ids(0, 1), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
			require.NoError(t, e.Add(&Request{ID: 1, Prompt: ids(0, 64), Output: ids(900, 1)}))
			pass(t, e, 0)
			got := e.CachedPrefixTokens(tt.prompt, tt.salt)
			assert.Equal(t, tt.want, got)

			r := &Request{ID: 2, Salt: tt.salt, Prompt: tt.prompt, Output: ids(900, 1)}
			require.NoError(t, e.Add(r))
			pass(t, e, time.Second)
			assert.Equal(t, got, r.CachedTokens, "admission finds as many")
		})
	}
}

// Looking a prompt up does not make its blocks recently used: the older sequence's
// blocks are still the ones evicted first.
func TestCachedPrefixTokensLeavesTheEvictionOrder(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 8, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192})
	a := &Request{ID: 1, Prompt: ids(0, 16), Output: ids(90, 1)}
	require.NoError(t, e.Add(a))
	_, _, evA := pass(t, e, 0)
	require.NoError(t, e.Add(&Request{ID: 2, Prompt: ids(100, 16), Output: ids(90, 1)}))
	pass(t, e, time.Second)

	require.Equal(t, 12, e.CachedPrefixTokens(ids(0, 16), 0))
	c := &Request{ID: 3, Prompt: ids(200, 8), Output: ids(90, 1)}
	require.NoError(t, e.Add(c))
	_, _, events := pass(t, e, 2*time.Second)
	require.NotEmpty(t, events)
	require.False(t, events[0].Stored)
	assert.ElementsMatch(t, evA[0].Hashes[2:], events[0].Hashes, "a's blocks, older, go first")
}
