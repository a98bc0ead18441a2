package sim

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
)

func TestValidateHostBlocks(t *testing.T) {
	tests := []struct {
		name                    string
		hostBlocks, chunkBlocks int
		wantErr                 string
	}{
		{"no host tier", 0, 0, ""},
		{"a host tier", 1000, 0, ""},
		{"negative", -1, 0, "host_blocks: must be ≥ 0 (0: no host tier), got -1"},
		{"chunks of four", 64, 4, ""},
		{"negative chunks", 64, -1, "host_chunk_blocks: must be from 0 to host_blocks (64), got -1"},
		{"a chunk larger than the tier", 8, 16, "host_chunk_blocks: must be from 0 to host_blocks (8), got 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.HostBlocks, cfg.HostChunkBlocks = tt.hostBlocks, tt.chunkBlocks
			err := cfg.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tt.wantErr)
		})
	}
}

// Without a host tier the engine schedules, times, caches and reports as before the
// tier existed; with one, the same workload runs otherwise (so the digest would see a
// change).
func TestNoHostTierChangesNothing(t *testing.T) {
	digest, _, _ := workloadDigest(t, 0)
	assert.Equal(t, uint64(plainWorkloadDigest), digest)
	withHost, _, _ := workloadDigest(t, 64)
	assert.NotEqual(t, digest, withHost, "the workload loads from the host tier")
}

// runAll runs passes from now until the engine is idle, returning the end time and the
// events.
func runAll(t *testing.T, e *Engine, now time.Duration) (time.Duration, []Event) {
	t.Helper()
	var all []Event
	for !e.Idle() {
		d, _, events := pass(t, e, now)
		now += d
		all = append(all, events...)
	}
	return now, all
}

// Every block the device caches is written through to the host tier, each run of
// newly written blocks a store event of the host's medium naming the device's blocks
// by their hashes alone, as vLLM's OffloadingConnector does. Blocks the host already
// holds are not written again.
func TestWriteThroughEmitsHostStoreEvents(t *testing.T) {
	const bs = 16
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 32, HostBlocks: 100})
	require.NoError(t, e.Add(&Request{ID: 1, Salt: 7, LoRA: "sql", Prompt: ids(0, 80), Output: ids(500, 1)}))
	now, events := runAll(t, e, 0)

	require.Len(t, events, 6, "a 32-token budget stores two blocks a pass, on the device and then on the host")
	var chain, onHostChain []uint64
	for i := 0; i < len(events); i += 2 {
		device, onHost := events[i].Wire(bs, "GPU"), events[i+1].Wire(bs, "")
		require.False(t, events[i].Host)
		require.True(t, events[i+1].Host)
		assert.Equal(t, "GPU", device.Medium)
		assert.Equal(t, kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: device.BlockHashes, BlockSize: bs, Medium: "CPU"}, onHost,
			"the host's store names the device's blocks by hash alone, in CPU whatever medium Wire is given")
		assert.Equal(t, "sql", device.LoRAName)
		assert.Equal(t, len(chain) > 0, device.HasParent)
		chain = index.ChainHashes(chain, device.Parent, device.HasParent, device.TokenIDs, bs, 7)
		onHostChain = append(onHostChain, onHost.BlockHashes...)
	}
	assert.Equal(t, index.BlockHashes(nil, ids(0, 80), bs, 7), chain, "the device events' tokens rebuild the engine's chain")
	assert.Equal(t, chain, onHostChain, "and the host holds every block of it")
	assert.Equal(t, 5, e.HostCachedBlocks())

	// A longer prompt hits the device's blocks; only its new block is written through.
	require.NoError(t, e.Add(&Request{ID: 2, Salt: 7, LoRA: "sql", Prompt: ids(0, 96), Output: ids(500, 1)}))
	_, events = runAll(t, e, now)
	require.Len(t, events, 2)
	assert.Equal(t, events[0].Hashes, events[1].Hashes)
	assert.True(t, events[1].Host)
	assert.Empty(t, events[1].Tokens, "a host store names its blocks by hash alone")
	assert.Equal(t, 6, e.HostCachedBlocks())
}

// prefillTime is the pass-time model's prefill part alone, for t tokens.
func prefillTime(t int) time.Duration {
	x := float64(t)
	return ms(4.209989e-7*x*x + 1.518344e-2*x + 16.50142)
}

// A prompt whose blocks the device evicted but the host holds is loaded, not
// recomputed: the pass computes only the rest, and takes HostLoadTime longer than a
// device hit's pass. The loaded blocks are cached on the device again; the host, which
// holds them, stores only the computed block.
func TestHostHeldPromptIsLoadedNotRecomputed(t *testing.T) {
	const bs = 16
	tests := []struct {
		name                         string
		gpuBlocks, hostBlocks        int
		wantCached, wantHost, wantRe int
	}{
		{"a device hit", 100, 0, 64, 0, 16},
		{"evicted from the device, held by the host", 8, 100, 0, 64, 16},
		{"evicted, no host tier", 8, 0, 0, 0, 80},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: tt.gpuBlocks, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: tt.hostBlocks})
			require.NoError(t, e.Add(&Request{ID: 1, Prompt: ids(0, 64), Output: ids(500, 1)}))
			now, _ := runAll(t, e, 0)
			// 8 blocks: on a small device, they evict the first prompt's 4.
			require.NoError(t, e.Add(&Request{ID: 2, Prompt: ids(1000, 128), Output: ids(500, 1)}))
			now, _ = runAll(t, e, now)

			r := &Request{ID: 3, Prompt: append(ids(0, 64), ids(5000, 16)...), Output: ids(500, 1)}
			require.NoError(t, e.Add(r))
			d, _, events := pass(t, e, now)
			assert.Equal(t, tt.wantCached, r.CachedTokens)
			assert.Equal(t, tt.wantHost, r.HostTokens)
			assert.Equal(t, tt.wantRe, r.RecomputedTokens)
			assert.Equal(t, len(r.Prompt), r.CachedTokens+r.TransferredTokens+r.HostTokens+r.RecomputedTokens)
			assert.Equal(t, tt.wantHost, e.HostTokens)
			assert.Equal(t, prefillTime(tt.wantRe)+HostLoadTime(tt.wantHost), d, "the recomputed tokens' prefill and the load")

			var stored, hostStored []uint64
			for _, ev := range events {
				switch {
				case ev.Stored && ev.Host:
					hostStored = append(hostStored, ev.Hashes...)
				case ev.Stored:
					stored = append(stored, ev.Hashes...)
				}
			}
			hashes := blockHashes(r.Prompt, bs)
			assert.Equal(t, hashes[tt.wantCached/bs:], stored, "the loaded and computed blocks are cached on the device")
			if tt.hostBlocks > 0 {
				assert.Equal(t, hashes[4:], hostStored, "the host already held the loaded blocks")
			}
		})
	}
}

// When the host tier is full, writing a block through evicts its least recently used
// block, with a removal event of the host's medium; a prompt whose blocks both tiers
// evicted is recomputed.
func TestHostEvictionEmitsARemovalAndTheEvictedPromptIsRecomputed(t *testing.T) {
	const bs = 16
	a, b := ids(0, 64), ids(1000, 64)
	tests := []struct {
		name        string
		hostBlocks  int
		wantRemoved []uint64 // by the host, when b is written through
		wantHost    int      // tokens of a loaded when it comes again
	}{
		{"the host holds both prompts", 8, nil, 48},
		// Leaves go first (a's deepest block first): a leaf is useless without its prefix.
		{"the host holds one: b evicts a", 4, reversed(blockHashes(a, bs)), 0},
		{"the host holds six: b evicts a's leaves, and a's prefix still loads", 6, reversed(blockHashes(a, bs)[2:]), 32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The device holds one prompt: b evicts a from it.
			e := newEngine(t, Config{NumGPUBlocks: 4, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: tt.hostBlocks})
			require.NoError(t, e.Add(&Request{ID: 1, Prompt: a, Output: ids(500, 1)}))
			now, _ := runAll(t, e, 0)
			require.NoError(t, e.Add(&Request{ID: 2, Prompt: b, Output: ids(500, 1)}))
			now, events := runAll(t, e, now)

			var removed []uint64
			for _, ev := range events {
				if ev.Host && !ev.Stored {
					w := ev.Wire(bs, "GPU")
					assert.Equal(t, kvevents.TypeBlockRemoved, w.Type)
					assert.Equal(t, "CPU", w.Medium)
					removed = append(removed, ev.Hashes...)
				}
			}
			assert.Equal(t, tt.wantRemoved, removed)
			assert.Equal(t, min(8, tt.hostBlocks), e.HostCachedBlocks())

			again := &Request{ID: 3, Prompt: a, Output: ids(500, 1)}
			require.NoError(t, e.Add(again))
			runAll(t, e, now)
			assert.Equal(t, 0, again.CachedTokens)
			assert.Equal(t, tt.wantHost, again.HostTokens)
			assert.Equal(t, 64-tt.wantHost, again.RecomputedTokens)
		})
	}
}

// A transferred request's prompt comes from the prefill worker: it loads nothing from
// the host tier, even when the host holds the prompt.
func TestTransferredRequestTakesNoHostHits(t *testing.T) {
	const bs = 16
	tests := []struct {
		name            string
		transferred     bool
		wantHost        int
		wantTransferred int
		wantRecomputed  int
	}{
		{"a plain request loads from the host", false, 48, 0, 16},
		{"a transferred request reads the prefill worker's", true, 0, 63, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 4, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: 16})
			require.NoError(t, e.Add(&Request{ID: 1, Prompt: ids(0, 64), Output: ids(500, 1)}))
			now, _ := runAll(t, e, 0)
			require.NoError(t, e.Add(&Request{ID: 2, Prompt: ids(1000, 64), Output: ids(500, 1)}))
			now, _ = runAll(t, e, now)
			require.Equal(t, 0, e.CachedPrefixTokens(ids(0, 64), 0), "the device evicted the prompt")

			r := &Request{ID: 3, Prompt: ids(0, 64), Output: ids(500, 1), Transferred: tt.transferred}
			require.NoError(t, e.Add(r))
			d, _, _ := pass(t, e, now)
			assert.Equal(t, tt.wantHost, r.HostTokens)
			assert.Equal(t, tt.wantTransferred, r.TransferredTokens)
			assert.Equal(t, tt.wantRecomputed, r.RecomputedTokens)
			if tt.transferred {
				assert.Equal(t, decodeTime(1), d, "a decode pass holding all 4 blocks, with no load")
			}
		})
	}
}

// A random workload on a small device and a smaller host, so that requests are
// preempted and both tiers evict: at first admission every prompt token is cached,
// transferred, loaded from the host or recomputed; the engine's counters sum the
// requests'; and the events, applied in order, rebuild both tiers' contents at the end
// of every pass.
func TestHostTierPromptTokensAddUpOverARandomWorkload(t *testing.T) {
	const bs = 4
	cfg := Config{NumGPUBlocks: 40, BlockSize: bs, MaxNumSeqs: 4, MaxBatchedTokens: 48, HostBlocks: 24}
	e := newEngine(t, cfg)
	rng := rand.New(rand.NewPCG(3, 4))
	device, host := map[uint64]bool{}, map[uint64]bool{}
	var all []*Request
	hostEvictions := 0
	now := time.Duration(0)
	for len(all) < 300 || !e.Idle() {
		if len(all) < 300 && rng.IntN(2) == 0 {
			prompt := append(ids(rng.IntN(4)*1000, 8+rng.IntN(24)), ids(5000+len(all)*50, 1+rng.IntN(30))...)
			r := &Request{ID: len(all) + 1, Prompt: prompt, Output: ids(900+len(all), 1+rng.IntN(30)), Transferred: rng.IntN(5) == 0}
			all = append(all, r)
			require.NoError(t, e.Add(r))
		}
		d, ok, err := e.StartPass(now)
		require.NoError(t, err)
		if !ok {
			now += time.Millisecond
			continue
		}
		_, events := e.EndPass(now + d)
		now += d
		for _, ev := range events {
			tier := device
			if ev.Host {
				tier = host
			}
			for _, h := range ev.Hashes {
				if ev.Stored {
					tier[h] = true
				} else {
					require.True(t, tier[h], "a removal of a block the tier holds")
					delete(tier, h)
				}
			}
			if ev.Host && !ev.Stored {
				hostEvictions += len(ev.Hashes)
			}
			if ev.Stored && !ev.Host {
				require.Len(t, ev.Tokens, len(ev.Hashes)*bs)
			}
		}
		require.Equal(t, slices.Sorted(maps.Keys(e.pool.cache)), slices.Sorted(maps.Keys(device)), "pass %d: the device's events", e.Passes)
		require.Equal(t, slices.Sorted(maps.Keys(e.host.entries)), slices.Sorted(maps.Keys(host)), "pass %d: the host's events", e.Passes)
		require.LessOrEqual(t, e.HostCachedBlocks(), cfg.HostBlocks)
		require.Less(t, now, time.Hour)
	}

	var prompts, recomputed, hostTokens, transferred, preemptions int
	for _, r := range all {
		require.True(t, r.Done())
		require.Equal(t, len(r.Prompt), r.CachedTokens+r.TransferredTokens+r.HostTokens+r.RecomputedTokens, "request %d", r.ID)
		if r.Transferred {
			assert.Zero(t, r.HostTokens, "request %d is transferred", r.ID)
		}
		prompts += len(r.Prompt)
		recomputed += r.RecomputedTokens
		hostTokens += r.HostTokens
		transferred += r.TransferredTokens
		preemptions += r.Preemptions
	}
	assert.Equal(t, prompts, e.PromptTokens)
	assert.Equal(t, recomputed, e.RecomputedTokens)
	assert.Equal(t, hostTokens, e.HostTokens)
	assert.Equal(t, transferred, e.TransferredTokens)

	assert.Positive(t, preemptions, "the workload preempts")
	assert.Positive(t, hostTokens, "the workload loads from the host")
	assert.Positive(t, e.HostReloadedTokens, "preempted requests reload from the host")
	assert.Positive(t, hostEvictions, "the host evicts")
}

// A preempted request admitted again loads from the host tier what the device evicted
// of it, and recomputes only the rest: PreemptedTokens leaves the loaded tokens out.
func TestPreemptedRequestReloadsFromTheHost(t *testing.T) {
	tests := []struct {
		name          string
		hostBlocks    int
		wantPreempted int
		wantReloaded  int
	}{
		{"no host tier: recomputed", 0, 5, 0},
		{"a host tier: its second block loaded", 16, 1, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// As in TestPreemptionOfTheNewestRunningRequest: young is preempted after its
			// first token, and old's growth evicts young's second block from the device.
			e := newEngine(t, Config{NumGPUBlocks: 5, BlockSize: 4, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: tt.hostBlocks})
			old := &Request{ID: 1, Prompt: ids(0, 8), Output: ids(50, 8)}
			young := &Request{ID: 2, Prompt: ids(100, 8), Output: ids(60, 8)}
			require.NoError(t, e.Add(old))
			require.NoError(t, e.Add(young))
			now, readmitted := time.Duration(0), false
			for !e.Idle() {
				waiting := slices.Contains(e.waiting, young) && young.Preemptions > 0
				d, _, _ := pass(t, e, now)
				now += d
				if waiting && slices.Contains(e.running, young) {
					readmitted = true
					assert.Equal(t, []Chunk{{Request: young, Tokens: tt.wantPreempted}}, e.Pass())
					assert.Equal(t, prefillTime(tt.wantPreempted)+HostLoadTime(tt.wantReloaded), d)
				}
			}
			require.True(t, readmitted)
			assert.Equal(t, 1, young.Preemptions)
			assert.Equal(t, tt.wantPreempted, young.PreemptedTokens)
			assert.Equal(t, tt.wantReloaded, e.HostReloadedTokens)
			assert.Zero(t, young.HostTokens, "nothing loaded at first admission")
		})
	}
}

func TestHostLoadTime(t *testing.T) {
	tests := []struct {
		name   string
		tokens int
		want   time.Duration
	}{
		{"nothing loaded: no time", 0, 0},
		{"one block of 16", 16, 80 * time.Microsecond},
		{"a 1,000-token prompt", 1000, 5 * time.Millisecond},
		{"a negative count is none", -3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, HostLoadTime(tt.tokens))
		})
	}
}

func reversed(hashes []uint64) []uint64 {
	out := slices.Clone(hashes)
	slices.Reverse(out)
	return out
}

// A host tier of chunks (LMCache's) writes a chunk once its blocks are all computed,
// one store event per chunk with its parent chunk and tokens; a removal names chunks.
func TestHostChunksAreStoredWholeWithTheirTokens(t *testing.T) {
	const bs, g = 16, 4
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: 8, HostChunkBlocks: g})
	prompt := ids(0, 10*bs) // two whole chunks and two blocks of a third
	require.NoError(t, e.Add(&Request{ID: 1, Salt: 7, Prompt: prompt, Output: ids(500, 1)}))
	now, events := runAll(t, e, 0)
	hashes7 := index.BlockHashes(nil, prompt, bs, 7)
	var chunks []kvevents.Event
	for _, ev := range events {
		if ev.Host {
			chunks = append(chunks, ev.Wire(bs, "GPU"))
		}
	}
	require.Len(t, chunks, 2, "the third chunk is not whole")
	for c, w := range chunks {
		assert.Equal(t, kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []uint64{hashes7[(c+1)*g-1]},
			Parent: map[bool]uint64{true: hashes7[g-1]}[c == 1], HasParent: c == 1,
			TokenIDs: prompt[c*g*bs : (c+1)*g*bs], BlockSize: g * bs, Medium: "CPU"}, w, "chunk %d", c)
	}
	assert.Equal(t, 8, e.HostCachedBlocks())

	// A third chunk from another prompt evicts the least recently used one: the second
	// (the prefix is touched after the leaf, as in the blocks' tier).
	require.NoError(t, e.Add(&Request{ID: 2, Salt: 7, Prompt: ids(1000, 4*bs), Output: ids(500, 1)}))
	_, events = runAll(t, e, now)
	var gone []uint64
	for _, ev := range events {
		if ev.Host && !ev.Stored {
			gone = append(gone, ev.Hashes...)
		}
	}
	assert.Equal(t, []uint64{hashes7[2*g-1]}, gone)
}

// Admission loads the host's chunks held from the prompt's start, whole, beyond the
// device's hits: a prompt that differs inside a chunk loads none of it.
func TestHostChunksLoadWholeFromThePromptsStart(t *testing.T) {
	const bs, g = 16, 4
	base := ids(0, 12*bs) // three chunks
	tests := []struct {
		name     string
		prompt   []uint32
		wantHost int
	}{
		{"the same prompt and more", append(slices.Clone(base), ids(9000, bs)...), 12 * bs},
		{"differs at a chunk's end", append(slices.Clone(base[:8*bs]), ids(9000, 4*bs)...), 8 * bs},
		{"differs inside a chunk", append(slices.Clone(base[:6*bs]), ids(9000, 6*bs)...), 4 * bs},
		{"differs in the first chunk", append(slices.Clone(base[:2*bs]), ids(9000, 10*bs)...), 0},
		{"ends inside a held chunk: its whole chunks (the part's hash is another)", base[:10*bs], 8 * bs},
		{"ends at a held chunk's end: all but the block of the token computed", base[:8*bs], 7 * bs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The device holds 14 blocks: the other prompt evicts base from it.
			e := newEngine(t, Config{NumGPUBlocks: 14, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: 64, HostChunkBlocks: g})
			require.NoError(t, e.Add(&Request{ID: 1, Prompt: base, Output: ids(500, 1)}))
			now, _ := runAll(t, e, 0)
			require.NoError(t, e.Add(&Request{ID: 2, Prompt: ids(50_000, 14*bs), Output: ids(500, 1)}))
			now, _ = runAll(t, e, now)

			r := &Request{ID: 3, Prompt: tt.prompt, Output: ids(500, 1)}
			require.NoError(t, e.Add(r))
			runAll(t, e, now)
			assert.Zero(t, r.CachedTokens, "the device holds none of it")
			assert.Equal(t, tt.wantHost, r.HostTokens)
			assert.Equal(t, len(r.Prompt)-tt.wantHost, r.RecomputedTokens)
		})
	}
}

// LMCache saves a request's chunks past those it held itself, whatever the device
// holds: a chunk the host lost but the device kept is written back (review,
// helper-46; the sim wrote only chunks past the device's hits).
func TestHostChunksTheDeviceHitIsWrittenBack(t *testing.T) {
	const bs, g = 16, 4
	e := newEngine(t, Config{NumGPUBlocks: 100, BlockSize: bs, MaxNumSeqs: 8, MaxBatchedTokens: 8192, HostBlocks: 8, HostChunkBlocks: g})
	a := ids(0, 4*bs)
	require.NoError(t, e.Add(&Request{ID: 1, Prompt: a, Output: ids(500, 1)}))
	now, _ := runAll(t, e, 0)
	require.NoError(t, e.Add(&Request{ID: 2, Prompt: ids(10_000, 8*bs), Output: ids(500, 1)}))
	now, _ = runAll(t, e, now) // two chunks of its own push a's off the host
	key := blockHashes(a, bs)[g-1]
	require.False(t, e.host.has(key))

	longer := &Request{ID: 3, Prompt: append(slices.Clone(a), ids(20_000, 4*bs+1)...), Output: ids(500, 1)}
	require.NoError(t, e.Add(longer))
	_, events := runAll(t, e, now)
	require.Equal(t, 4*bs, longer.CachedTokens, "the device still holds a")
	assert.True(t, e.host.has(key), "its chunk is written back to the host")
	var stored []uint64
	for _, ev := range events {
		if ev.Host && ev.Stored {
			stored = append(stored, ev.Hashes...)
		}
	}
	assert.Contains(t, stored, key)
}
