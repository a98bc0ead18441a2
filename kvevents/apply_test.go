package kvevents

import (
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/router"
)

const (
	testModel = "qwen"
	testBS    = 4
)

// harness is one worker's applier over a real event index.
type harness struct {
	t       *testing.T
	idx     *index.EventIndex
	a       *Applier
	reg     *prometheus.Registry
	metrics *Metrics
	clock   *fakeclock.Clock
}

func newHarness(t *testing.T, ranks int, edit func(*Config, *WorkerSpec)) *harness {
	t.Helper()
	cfg := DefaultConfig()
	spec := WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: ranks, MaxEntries: 2000}
	if edit != nil {
		edit(&cfg, &spec)
	}
	return newHarnessOver(t, index.Config{CapacityBlocks: 1000, TTL: time.Minute, PendingTTL: time.Second}, cfg, spec)
}

// newHarnessOver is the applier of spec over an event index configured by idxCfg,
// holding worker "w".
func newHarnessOver(t *testing.T, idxCfg index.Config, cfg Config, spec WorkerSpec) *harness {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_800_000_000, 0))
	idx, err := index.NewEventIndex(idxCfg, clock.Now)
	require.NoError(t, err)
	require.NoError(t, idx.SetWorker("w", 0))
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	return &harness{t: t, idx: idx, a: NewApplier(spec, cfg, idx, m, nil), reg: reg, metrics: m, clock: clock}
}

// apply encodes events into one batch of rank and applies it.
func (h *harness) apply(rank int, events ...Event) {
	h.t.Helper()
	payload, err := Encode(&Batch{TS: float64(h.clock.Now().Unix()), Events: events, Rank: rank, HasRank: true}, FormMap)
	require.NoError(h.t, err)
	require.NoError(h.t, h.a.applyAt(rank, payload, h.clock.Now()))
}

// overlap is what a request with these tokens would get: its blocks hashed as the
// router hashes them, walked through what the engine reported.
func (h *harness) overlap(tokens []uint32, lora, cacheSalt string) int {
	hashes := index.BlockHashes(nil, tokens, testBS, index.Salt(testModel, lora, cacheSalt))
	ov := make([]int, 1)
	h.idx.ConfirmedOverlaps(hashes, []string{"w"}, ov)
	return ov[0]
}

// offloaded is the device overlap and the offloaded run after it that a request with
// these tokens would get.
func (h *harness) offloaded(tokens []uint32) (device, run int) {
	hashes := index.BlockHashes(nil, tokens, testBS, index.Salt(testModel, "", ""))
	ov, off := make([]int, 1), make([]int, 1)
	h.idx.ConfirmedOverlaps(hashes, []string{"w"}, ov)
	h.idx.Offloaded(hashes, []string{"w"}, ov, off)
	return ov[0], off[0]
}

// checkOffloadedThenClear asserts what a request with these tokens gets (device
// overlap and offloaded run), the blocks the offload index holds and the engine-hash
// entries, then clears the worker and asserts both maps empty.
func (h *harness) checkOffloadedThenClear(tokens []uint32, device, run, held, entries int) {
	h.t.Helper()
	gotDevice, gotRun := h.offloaded(tokens)
	assert.Equal(h.t, [2]int{device, run}, [2]int{gotDevice, gotRun})
	assert.Equal(h.t, held, h.idx.OffloadedEntries("w"))
	assert.Equal(h.t, entries, h.a.Entries(), "the engine-hash entries count kvroute's blocks")
	h.apply(0, Event{Type: TypeAllBlocksCleared})
	assert.Zero(h.t, h.idx.OffloadedEntries("w"))
	assert.Zero(h.t, h.a.Entries())
}

func (h *harness) count(typ Type, outcome string) float64 {
	return testutil.ToFloat64(h.metrics.events.WithLabelValues(typ.String(), outcome))
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func stored(hashes []uint64, parent uint64, tokens []uint32) Event {
	return Event{Type: TypeBlockStored, BlockHashes: hashes, Parent: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: testBS}
}

func removed(hashes ...uint64) Event { return Event{Type: TypeBlockRemoved, BlockHashes: hashes} }

func TestAppliedBlocksMatchTheRequestsHashes(t *testing.T) {
	h := newHarness(t, 1, nil)
	prompt := toks(100, 5*testBS)
	// The engine reports the prompt in two steps, with its own (opaque) hashes.
	h.apply(0, stored([]uint64{901, 902}, 0, prompt[:2*testBS]))
	h.apply(0, stored([]uint64{903, 904, 905}, 902, prompt[2*testBS:]))
	assert.Equal(t, 5, h.overlap(prompt, "", ""), "a request for the prompt overlaps all five blocks")
	assert.Equal(t, 3, h.overlap(append(prompt[:3*testBS:3*testBS], toks(0, 2*testBS)...), "", ""), "a prompt that diverges at block 3")
	assert.Equal(t, 0, h.overlap(prompt, "lora", ""), "another namespace does not match")
	assert.Equal(t, index.ModeEvents, h.idx.Mode("w"), "a worker whose events arrive is in event mode")

	h.apply(0, removed(903))
	assert.Equal(t, 2, h.overlap(prompt, "", ""), "a removal cuts the chain where the engine evicted")
	h.apply(0, Event{Type: TypeAllBlocksCleared})
	assert.Equal(t, 0, h.overlap(prompt, "", ""))
	assert.Zero(t, h.a.Entries(), "the engine-hash map empties with the index")
	assert.Equal(t, 3.0, h.count(TypeBlockStored, outcomeApplied)+h.count(TypeBlockRemoved, outcomeApplied)+h.count(TypeAllBlocksCleared, outcomeApplied)-1)
}

func TestSaltsFollowTheChain(t *testing.T) {
	prompt := toks(7, 3*testBS)
	tests := []struct {
		name      string
		first     Event
		lora      string
		cacheSalt string
	}{
		{"vLLM LoRA and cache salt in extra keys", Event{LoRAName: "sql",
			ExtraKeys: []ExtraKeys{{Strings: []string{"sql", "tenant-a"}}, {Strings: []string{"sql"}}}}, "sql", "tenant-a"},
		{"vLLM cache salt alone", Event{ExtraKeys: []ExtraKeys{{Strings: []string{"tenant-a"}}, {}}}, "", "tenant-a"},
		{"SGLang cache_salt field", Event{CacheSalt: "tenant-a"}, "", "tenant-a"},
		{"LoRA only", Event{LoRAName: "sql", ExtraKeys: []ExtraKeys{{Strings: []string{"sql"}}, {Strings: []string{"sql"}}}}, "sql", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			first := stored([]uint64{1, 2}, 0, prompt[:2*testBS])
			first.LoRAName, first.ExtraKeys, first.CacheSalt = tt.first.LoRAName, tt.first.ExtraKeys, tt.first.CacheSalt
			h.apply(0, first)
			// The next step's block names only its parent (and the LoRA): the salt of
			// block 0 must carry down the chain.
			next := stored([]uint64{3}, 2, prompt[2*testBS:])
			next.LoRAName = tt.first.LoRAName
			h.apply(0, next)
			assert.Equal(t, 3, h.overlap(prompt, tt.lora, tt.cacheSalt))
			assert.Equal(t, 0, h.overlap(prompt, "", ""), "the base namespace does not match")
		})
	}
}

func TestEventsThatCannotBeIndexedAreCountedAndSkipped(t *testing.T) {
	prompt := toks(0, 2*testBS)
	tests := []struct {
		name    string
		event   Event
		outcome string
	}{
		{"second CPU tier", Event{Medium: "CPU_TIER2"}, outcomeOtherTier},
		{"disk tier", Event{Medium: "DISK"}, outcomeOtherTier},
		{"sliding window group", Event{GroupIdx: 1, SpecKind: "sliding_window"}, outcomeNotIndexable},
		{"mamba group", Event{GroupIdx: 2, SpecKind: "mamba"}, outcomeNotIndexable},
		{"other block size", Event{BlockSize: 8}, outcomeBlockSize},
		{"token count", Event{TokenIDs: prompt[:5]}, outcomeMalformed},
		{"extra keys count", Event{ExtraKeys: []ExtraKeys{{}}}, outcomeMalformed},
		{"LoRA id without name", Event{HasLoRAID: true, LoRAID: 3}, outcomeUnattributable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			ev := stored([]uint64{1, 2}, 0, prompt)
			ev.Medium, ev.GroupIdx, ev.SpecKind, ev.ExtraKeys = tt.event.Medium, tt.event.GroupIdx, tt.event.SpecKind, tt.event.ExtraKeys
			ev.HasLoRAID, ev.LoRAID = tt.event.HasLoRAID, tt.event.LoRAID
			if tt.event.BlockSize != 0 {
				ev.BlockSize = tt.event.BlockSize
				ev.TokenIDs = toks(0, 2*tt.event.BlockSize)
			}
			if tt.event.TokenIDs != nil {
				ev.TokenIDs = tt.event.TokenIDs
			}
			h.apply(0, ev)
			assert.Equal(t, 1.0, h.count(TypeBlockStored, tt.outcome))
			assert.Equal(t, 0, h.overlap(prompt, "", ""))
			assert.Zero(t, h.a.Entries())
		})
	}
}

func TestHostTierCountsWhenConfigured(t *testing.T) {
	h := newHarness(t, 1, func(c *Config, _ *WorkerSpec) { c.Tiers, c.OffloadTiers = []string{"device", "host"}, nil })
	prompt := toks(0, 2*testBS)
	gpu, cpu := stored([]uint64{1, 2}, 0, prompt), stored([]uint64{1, 2}, 0, prompt)
	gpu.Medium, cpu.Medium = "GPU", "CPU_PINNED"
	h.apply(0, gpu, cpu)
	assert.Equal(t, 2, h.overlap(prompt, "", ""))
	gone := removed(1, 2)
	gone.Medium = "GPU"
	h.apply(0, gone)
	assert.Equal(t, 2, h.overlap(prompt, "", ""), "the host copy still holds the blocks")
	gone.Medium = "CPU_PINNED"
	h.apply(0, gone)
	assert.Equal(t, 0, h.overlap(prompt, "", ""))
}

func TestOffloadTiersAreIndexedApartFromTheDevice(t *testing.T) {
	prompt := toks(0, 4*testBS)
	h := newHarness(t, 1, nil) // the default: device held, host offloaded
	gpu := stored([]uint64{1, 2}, 0, prompt[:2*testBS])
	cpu := stored([]uint64{101, 102, 103}, 0, prompt[:3*testBS]) // the engine hashes each tier apart
	gpu.Medium, cpu.Medium = "GPU", "CPU"
	h.apply(0, gpu, cpu)
	device, run := h.offloaded(prompt)
	assert.Equal(t, [2]int{2, 1}, [2]int{device, run}, "two blocks on device, the third loaded from the host")
	assert.Equal(t, 2.0, h.count(TypeBlockStored, outcomeApplied))
	assert.Equal(t, 3, h.idx.OffloadedEntries("w"))

	gone := removed(1, 2)
	gone.Medium = "GPU"
	h.apply(0, gone)
	device, run = h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 3}, [2]int{device, run}, "evicted from the device, the host copy still serves the prompt")

	child := stored([]uint64{104}, 103, prompt[3*testBS:])
	child.Medium = "CPU_PINNED"
	h.apply(0, child)
	device, run = h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 4}, [2]int{device, run}, "a host block chains to its host parent")

	hostGone := removed(102)
	hostGone.Medium = "CPU"
	h.apply(0, hostGone)
	device, run = h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 1}, [2]int{device, run}, "a host eviction cuts the run")

	h.apply(0, Event{Type: TypeAllBlocksCleared})
	assert.Zero(t, h.idx.OffloadedEntries("w"))
	assert.Zero(t, h.a.Entries())
}

func TestABlockOnDeviceAndHostLeavesEachIndexOnItsOwnRemoval(t *testing.T) {
	// Two data-parallel ranks make the held use two sources (reference counted); the
	// host copy must not keep a device block alive, nor the reverse.
	h := newHarness(t, 2, nil)
	prompt := toks(0, 2*testBS)
	gpu0, gpu1, cpu := stored([]uint64{1, 2}, 0, prompt), stored([]uint64{11, 12}, 0, prompt), stored([]uint64{21, 22}, 0, prompt)
	cpu.Medium = "CPU"
	h.apply(0, gpu0, cpu)
	h.apply(1, gpu1)
	h.apply(0, removed(1, 2))
	device, run := h.offloaded(prompt)
	assert.Equal(t, [2]int{2, 0}, [2]int{device, run}, "rank 1 still holds the prompt on device")
	h.apply(1, removed(11, 12))
	device, run = h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 2}, [2]int{device, run}, "off the device on both ranks, the host copy is left")
	hostGone := removed(21, 22)
	hostGone.Medium = "CPU"
	h.apply(0, hostGone)
	device, run = h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 0}, [2]int{device, run})
	assert.Zero(t, h.a.Entries())
}

func TestNonIndexableGroupsRemovalsLeaveTheFullAttentionGroup(t *testing.T) {
	h := newHarness(t, 1, nil)
	prompt := toks(0, 2*testBS)
	full, window := stored([]uint64{1, 2}, 0, prompt), stored([]uint64{1, 2}, 0, prompt)
	full.SpecKind, window.GroupIdx, window.SpecKind = "full_attention", 1, "sliding_window"
	h.apply(0, full, window)
	windowGone := removed(1)
	windowGone.GroupIdx = 1
	h.apply(0, windowGone)
	assert.Equal(t, 2, h.overlap(prompt, "", ""), "a sliding window dropping block 0 does not evict the full-attention copy")
	assert.Equal(t, 1.0, h.count(TypeBlockRemoved, outcomeNotIndexable))
}

// TestAGroupsRemovalsApplyWhileItHoldsBlocksWhateverItWasCalled: a BlockStored
// naming a cache group's kind marks a group that cannot be indexed (a sliding window),
// and removals there are skipped (not_indexable); stores without a kind (older engines
// send none) are applied whatever the mark. A removal now applies whenever the group
// holds blocks on that rank and tier, and a clear forgets the rank's marks (a
// restarted engine may serve another model). Before, a mark was kept for good, across
// clears and restarts, and the group's later blocks stayed in the index after the
// engine removed them.
func TestAGroupsRemovalsApplyWhileItHoldsBlocksWhateverItWasCalled(t *testing.T) {
	prompt := toks(0, 2*testBS)
	window := stored([]uint64{50}, 0, toks(500, testBS))
	window.SpecKind = "sliding_window" // group 0
	tests := []struct {
		name  string
		clear bool // AllBlocksCleared after the mark (the engine restarted, or said it cleared)
	}{
		{"across a clear", true},
		{"without a clear", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			h.apply(0, window)
			if tt.clear {
				h.apply(0, Event{Type: TypeAllBlocksCleared})
			}
			h.apply(0, stored([]uint64{1, 2}, 0, prompt)) // no kind, group 0: applied
			require.Equal(t, 2, h.overlap(prompt, "", ""))
			h.apply(0, removed(1, 2))
			assert.Equal(t, 0, h.overlap(prompt, "", ""), "the engine removed both blocks")
			assert.Zero(t, h.count(TypeBlockRemoved, outcomeNotIndexable))
			assert.Zero(t, h.a.Entries())
		})
	}
	t.Run("a rank's clear forgets its marks only", func(t *testing.T) {
		h := newHarness(t, 2, nil)
		h.apply(0, window)
		h.apply(1, window)
		h.apply(1, Event{Type: TypeAllBlocksCleared})
		h.apply(0, removed(50))
		assert.Equal(t, 1.0, h.count(TypeBlockRemoved, outcomeNotIndexable), "rank 0's group is still a sliding window")
		h.apply(1, removed(50))
		assert.Equal(t, 1.0, h.count(TypeBlockRemoved, outcomeNotIndexable), "rank 1's mark went with its clear")
		assert.Equal(t, 1.0, h.count(TypeBlockRemoved, outcomeApplied))
	})
}

// TestTheGroupsMarkedNotIndexableAreBounded: what a BlockStored says of its cache
// group is remembered only for a well-formed event (a malformed group_idx may be any
// int64), for at most maxGroups groups of a rank, and until the rank is cleared. Before,
// a malformed event's group_idx was recorded (fixed in c880afe), and every group was
// kept for good.
func TestTheGroupsMarkedNotIndexableAreBounded(t *testing.T) {
	const n = 5000
	tests := []struct {
		name   string
		group  func(i int) int
		marked int
	}{
		{"malformed group_idx", func(i int) int { return 1<<20 + i }, 0},
		{"a group each", func(i int) int { return i }, maxGroups},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			events := make([]Event, n)
			for i := range events {
				events[i] = Event{Type: TypeBlockStored, GroupIdx: tt.group(i), SpecKind: "sliding_window"}
			}
			payload, err := Encode(&Batch{Events: events}, FormMap)
			require.NoError(t, err)
			require.NoError(t, h.a.Apply(0, payload))
			assert.Len(t, h.a.skipped, tt.marked)
			h.apply(0, Event{Type: TypeAllBlocksCleared})
			assert.Empty(t, h.a.skipped)
		})
	}
}

func TestUnknownParentsAreSkippedAndEvictedParentsStillChain(t *testing.T) {
	h := newHarness(t, 1, nil)
	prompt := toks(0, 3*testBS)
	h.apply(0, stored([]uint64{12}, 11, prompt[testBS:2*testBS]))
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnknownParent))
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.unknownParents.WithLabelValues("w")))

	h.apply(0, stored([]uint64{1, 2}, 0, prompt[:2*testBS]), removed(2))
	h.apply(0, stored([]uint64{3}, 2, prompt[2*testBS:]))
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnknownParent), "a recently evicted parent still places its child")
	h.apply(0, stored([]uint64{2}, 1, prompt[testBS:2*testBS]))
	assert.Equal(t, 3, h.overlap(prompt, "", ""))
}

func TestMultimodalBlocksNeverMatchATextRequest(t *testing.T) {
	h := newHarness(t, 1, nil)
	prompt := toks(0, 2*testBS)
	ev := stored([]uint64{1, 2}, 0, prompt)
	ev.ExtraKeys = []ExtraKeys{{}, {Other: 0xabc}}
	h.apply(0, ev)
	assert.Equal(t, 1, h.overlap(prompt, "", ""), "block 1 carries an image's identifier a request hash cannot reproduce")
}

func TestDataParallelRanksAreOneWorkerHoldingTheirUnion(t *testing.T) {
	h := newHarness(t, 2, nil)
	prompt := toks(0, 2*testBS)
	h.apply(0, stored([]uint64{1, 2}, 0, prompt))
	h.apply(1, stored([]uint64{7, 8}, 0, prompt))
	h.apply(0, removed(1, 2))
	assert.Equal(t, 2, h.overlap(prompt, "", ""), "rank 1 still holds the prompt")
	h.apply(1, Event{Type: TypeAllBlocksCleared})
	assert.Equal(t, 0, h.overlap(prompt, "", ""))
	assert.Zero(t, h.a.Entries())

	payload, err := Encode(&Batch{HasRank: true, Rank: 1, Events: []Event{stored([]uint64{1}, 0, prompt[:testBS])}}, FormArray)
	require.NoError(t, err)
	require.NoError(t, h.a.Apply(0, payload))
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeRankOutOfRange), "a batch on another rank's stream is not attributed")
}

// TestAWorkerWhoseRanksStartPastZeroAttributesTheirBatches: a discovered pod's second
// port fronts ranks 2 and 3 (router.KVEvents.FirstRank); their batches name ranks 2
// and 3 and are the worker's, and one naming rank 0 is not.
func TestAWorkerWhoseRanksStartPastZeroAttributesTheirBatches(t *testing.T) {
	h := newHarness(t, 2, func(_ *Config, s *WorkerSpec) { s.FirstRank = 2 })
	prompt := toks(0, 2*testBS)
	encode := func(rank int, ev Event) []byte {
		payload, err := Encode(&Batch{HasRank: true, Rank: rank, Events: []Event{ev}}, FormMap)
		require.NoError(t, err)
		return payload
	}
	require.NoError(t, h.a.Apply(0, encode(2, stored([]uint64{1}, 0, prompt[:testBS]))))
	require.NoError(t, h.a.Apply(1, encode(3, stored([]uint64{7, 8}, 0, prompt))))
	assert.Equal(t, 2, h.overlap(prompt, "", ""))
	assert.Zero(t, h.count(TypeBlockStored, outcomeRankOutOfRange))
	require.NoError(t, h.a.Apply(0, encode(0, stored([]uint64{9}, 0, prompt[:testBS]))))
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeRankOutOfRange), "rank 0 is another worker's")
}

func TestTheEngineHashMapIsBounded(t *testing.T) {
	h := newHarness(t, 1, func(_ *Config, s *WorkerSpec) { s.MaxEntries = 10 })
	for i := range 6 {
		h.apply(0, stored([]uint64{uint64(2*i + 1), uint64(2*i + 2)}, 0, toks(100*i, 2*testBS)))
	}
	assert.LessOrEqual(t, h.a.Entries(), 10)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonOverflow)))
	assert.LessOrEqual(t, h.idx.ConfirmedEntries("w"), 10)
}

// TestCacheGroupsHoldNothingUntilABlockIsMappedAndAreBounded: each rank, tier and
// group_idx has engine-hash maps of its own, and group_idx is the engine's to choose
// (below 65,536). A store that maps nothing (its parent unknown) makes none, the maps
// are not sized ahead of their blocks, and a rank's tier keeps at most maxGroups of
// them: one more clears the rank (reason groups). Before, each group's were made
// before the parent was checked, pre-sized for min(bound/2, 65,536) entries, and kept
// until a clear that an empty map never triggers: 200 stores of unknown parents (30
// KB) kept 112 MB.
func TestCacheGroupsHoldNothingUntilABlockIsMappedAndAreBounded(t *testing.T) {
	tests := []struct {
		name    string
		parent  uint64 // 0: each store is a root; else a parent never stored
		groups  int
		sources int     // sources after
		resets  float64 // resets for groups
	}{
		{"stores of unknown parents make no maps", 7, 200, 0, 0},
		{"roots in more groups than kept clear the rank", 0, 200, 200 % maxGroups, 200 / maxGroups},
		{"a hybrid model's few groups are kept", 0, 4, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const capacity = 16384 // index.DefaultConfig().CapacityBlocks
			h := newHarness(t, 1, func(_ *Config, s *WorkerSpec) { s.MaxEntries = 2 * capacity })
			events := make([]Event, tt.groups)
			for g := range events {
				events[g] = stored([]uint64{uint64(10 + g)}, tt.parent, toks(0, testBS))
				events[g].GroupIdx = g
			}
			payload, err := Encode(&Batch{Events: events}, FormMap)
			require.NoError(t, err)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			require.NoError(t, h.a.Apply(0, payload))
			runtime.GC()
			runtime.ReadMemStats(&after)
			retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			runtime.KeepAlive(h)
			assert.Less(t, retained, int64(4<<20), "%d stores (%d bytes) retain %d KB", tt.groups, len(payload), retained>>10)
			assert.Len(t, h.a.sources, tt.sources)
			assert.Equal(t, tt.sources, h.a.Entries())
			assert.Equal(t, tt.resets, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonGroups)))
		})
	}
}

func TestAnUndecodablePayloadChangesNothing(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.apply(0, stored([]uint64{1}, 0, toks(0, testBS)))
	assert.ErrorIs(t, h.a.Apply(0, []byte{0xc1}), ErrPayload)
	assert.Equal(t, 1, h.overlap(toks(0, testBS), "", ""))
}

func TestMetricsLint(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.apply(0, stored([]uint64{1}, 0, toks(0, testBS)))
	problems, err := testutil.CollectAndLint(h.metrics.events)
	require.NoError(t, err)
	assert.Empty(t, problems)
	reg := prometheus.NewRegistry()
	m, err := New(DefaultConfig(), Deps{Index: h.idx, BlockSize: testBS, Registerer: reg})
	require.NoError(t, err)
	m.SetWorkers(nil)
	m.metrics.gap("w")
	m.metrics.replay("w", "ok")
	m.metrics.reset("w", reasonGap)
	m.metrics.decodeError("w")
	m.metrics.observeLag(1, time.Unix(2, 0))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		problems, err := testutil.GatherAndLint(reg, mf.GetName())
		require.NoError(t, err)
		assert.Empty(t, problems, mf.GetName())
	}
}

// TestARemovedWorkersSeriesAreDropped: a worker that leaves the fleet (a pod gone)
// takes its per-worker series with it; one that only changes keeps them.
func TestARemovedWorkersSeriesAreDropped(t *testing.T) {
	h := newHarness(t, 1, nil)
	reg := prometheus.NewRegistry()
	m, err := New(DefaultConfig(), Deps{Index: h.idx, BlockSize: testBS, Registerer: reg})
	require.NoError(t, err)
	worker := func(name, endpoint string) router.Worker {
		return router.Worker{Name: name, Address: "127.0.0.1:1", Models: []string{testModel}, KVEvents: &router.KVEvents{Endpoint: endpoint}}
	}
	series := func(worker string) int {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		n := 0
		for _, mf := range mfs {
			for _, metric := range mf.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == "worker" && l.GetValue() == worker && strings.HasSuffix(mf.GetName(), "_total") {
						n++
					}
				}
			}
		}
		return n
	}
	m.SetWorkers([]router.Worker{worker("gone", "tcp://127.0.0.1:1"), worker("moved", "tcp://127.0.0.1:2")})
	for _, w := range []string{"gone", "moved"} {
		m.metrics.unknownParent(w)
		m.metrics.gap(w)
		m.metrics.replay(w, "ok")
		m.metrics.reset(w, reasonGap)
		m.metrics.prune(w, 1)
		m.metrics.decodeError(w)
		m.metrics.refusedConn(w)
	}
	require.Equal(t, 7, series("gone"))
	m.SetWorkers([]router.Worker{worker("moved", "tcp://127.0.0.1:3")})
	assert.Zero(t, series("gone"), "the removed worker's series are dropped")
	assert.Equal(t, 7, series("moved"), "a changed worker keeps its counts")
}

func TestSubscribingAWorkerWithTheApproximateTokenizerWarns(t *testing.T) {
	h := newHarness(t, 1, nil)
	var logs strings.Builder
	m, err := New(DefaultConfig(), Deps{Index: h.idx, BlockSize: testBS, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		ApproxTokenizer: func(model string) bool { return model == testModel }})
	require.NoError(t, err)
	m.SetWorkers([]router.Worker{{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://127.0.0.1:1"}}})
	assert.Contains(t, logs.String(), "approximate tokenizer")
	assert.Contains(t, logs.String(), "worker=w")
}

// An engine that sends lora_id and the adapter's name in extra_keys but no lora_name:
// the name cannot be told from a cache salt there, so the blocks are not indexed at
// all, neither as a base-model request's cache salt nor as the adapter's.
func TestALoRAIDWithoutItsNameIsUnattributableWhateverItsExtraKeys(t *testing.T) {
	h := newHarness(t, 1, nil)
	prompt := toks(7, 2*testBS)
	ev := stored([]uint64{1, 2}, 0, prompt)
	ev.HasLoRAID, ev.LoRAID = true, 3
	ev.ExtraKeys = []ExtraKeys{{Strings: []string{"sql"}}, {Strings: []string{"sql"}}}
	h.apply(0, ev)
	assert.Equal(t, 0, h.overlap(prompt, "", "sql"), "a base-model request with cache_salt \"sql\" does not match the adapter's blocks")
	assert.Equal(t, 0, h.overlap(prompt, "sql", ""))
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnattributable))
}

// TestHostStoresByHashAloneAreTheDevicesBlocks: vLLM's OffloadingConnector reports a
// host copy with the device block's hash and nothing else (no token ids, no parent,
// block_size 0 or its own). kvroute takes the block the same rank's device reported
// under that hash, live or recently removed; a hash the device never reported is
// skipped and counted. (block_size a multiple of it: TestVLLMHostBlocksOfSeveralDeviceBlocks.)
func TestHostStoresByHashAloneAreTheDevicesBlocks(t *testing.T) {
	for _, blockSize := range []int{0, testBS} {
		h := newHarness(t, 1, nil)
		prompt := toks(0, 3*testBS)
		h.apply(0, stored([]uint64{1, 2, 3}, 0, prompt))
		h.apply(0, removed(3)) // the device evicted block 3 before it was copied
		h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{1, 2, 3}, BlockSize: blockSize, Medium: "CPU"})
		h.apply(0, removed(1, 2))
		device, run := h.offloaded(prompt)
		assert.Equal(t, [2]int{0, 3}, [2]int{device, run}, "block_size %d: the host holds the three device blocks", blockSize)

		hostGone := removed(2)
		hostGone.Medium = "CPU"
		h.apply(0, hostGone)
		_, run = h.offloaded(prompt)
		assert.Equal(t, 1, run, "block_size %d: its removal by hash applies", blockSize)

		h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{99}, Medium: "CPU"})
		assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnknownBlock), "block_size %d: a hash the device never reported", blockSize)
	}
}

// TestVLLMHostBlocksOfSeveralDeviceBlocks: vLLM's OffloadingConnector with an offloaded
// block size k times the GPU's (here 4) names each host block by the hash of the last
// of its k device blocks and sends block_size k times kvroute's. kvroute takes it as
// that device block and the three before it in the device's chain (live or recently
// removed), and walks whole host blocks from the one holding the end of the device
// overlap, as vLLM looks them up.
func TestVLLMHostBlocksOfSeveralDeviceBlocks(t *testing.T) {
	const k = 4
	prompt := toks(0, 12*testBS)
	device := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	host := func(blockSize int, hashes ...uint64) Event {
		return Event{Type: TypeBlockStored, BlockHashes: hashes, BlockSize: blockSize, Medium: "CPU"}
	}
	diverging := func(block int) []uint32 {
		return append(slices.Clone(prompt[:block*testBS]), toks(50_000, len(prompt)-block*testBS)...)
	}
	tests := []struct {
		name    string
		keep    int   // device blocks left on device (the rest removed before the host store)
		host    Event // the host store
		then    func(h *harness)
		tokens  []uint32
		device  int // the device overlap
		run     int // the offloaded run after it
		held    int // blocks in the offload index
		outcome string
		// offloadBlockSize is kv_events.offload_block_size (0: as the events say).
		offloadBlockSize int
	}{
		{"each host block is its device block and the three before it", 0, host(k*testBS, 4, 8, 12), nil, prompt, 0, 12, 12, outcomeApplied, 0},
		{"removing a host block removes its four", 0, host(k*testBS, 4, 8, 12), func(h *harness) {
			gone := removed(8)
			gone.Medium = "CPU"
			h.apply(0, gone)
		}, prompt, 0, 4, 8, outcomeApplied, 0},
		{"a host block short of predecessors is skipped, the others kept", 4, host(k*testBS, 3, 8), nil, prompt, 4, 4, 4, outcomeApplied, 0},
		{"a host block whose predecessors are unknown alone is unknown", 0, host(k*testBS, 3), nil, prompt, 0, 0, 0, outcomeUnknownBlock, 0},
		{"the run starts at the host block holding the device overlap's end", 6, host(k*testBS, 8, 12), nil, prompt, 6, 6, 8, outcomeApplied, 0},
		{"a device overlap at a host block's end starts at the next", 8, host(k*testBS, 12), nil, prompt, 8, 4, 4, outcomeApplied, 0},
		{"a device overlap inside a host block the host lacks loads nothing", 6, host(k*testBS, 4, 12), nil, prompt, 6, 0, 8, outcomeApplied, 0},
		{"a prompt that differs inside a host block loads up to its start", 0, host(k*testBS, 4, 8, 12), nil, diverging(10), 0, 8, 12, outcomeApplied, 0},
		{"block_size 0: each host hash is its device block alone", 0, host(0, 4, 8, 12), nil, prompt, 0, 0, 3, outcomeApplied, 0},
		{"block_size 0 with kv_events.offload_block_size: the configured k", 0, host(0, 4, 8, 12), nil, prompt, 0, 12, 12, outcomeApplied, k * testBS},
		{"block_size kvroute's: each host hash is its device block alone", 0, host(testBS, 1, 2, 3, 4), nil, prompt, 0, 4, 4, outcomeApplied, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, func(c *Config, _ *WorkerSpec) { c.OffloadBlockSize = tt.offloadBlockSize })
			// A first host store of blocks of k (of a hash the device never reported)
			// makes the applier keep the device's chain from then on.
			h.apply(0, host(k*testBS, 999))
			// The device reports the prompt in two stores: the second's first block
			// chains to the first's last through the event's parent.
			h.apply(0, stored(device[:6], 0, prompt[:6*testBS]), stored(device[6:], 6, prompt[6*testBS:]))
			h.apply(0, removed(device[tt.keep:]...))
			before := h.count(TypeBlockStored, tt.outcome)
			h.apply(0, tt.host)
			assert.Equal(t, before+1, h.count(TypeBlockStored, tt.outcome), "the host store's outcome")
			if tt.then != nil {
				tt.then(h)
			}
			h.checkOffloadedThenClear(tt.tokens, tt.device, tt.run, tt.held, tt.held+tt.keep)
		})
	}
}

// sentIndex counts the blocks the applier sends the index's offload tiers.
type sentIndex struct {
	Index
	offloadStored int
}

func (s *sentIndex) OffloadStored(worker string, hashes []uint64) error {
	s.offloadStored += len(hashes)
	return s.Index.OffloadStored(worker, hashes)
}

// allocDuring returns the bytes allocated while f runs.
func allocDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestAHostStoreByHashMapsEachBlockOnceAndStopsAtACycle: a host store named by hash
// alone (vLLM's OffloadingConnector) walks the device's chain k blocks back for each
// host block it names, and an engine's stream is hostile input. A hash named twice in
// one store is one block; a walk that comes back to a hash it passed (the device
// stored a hash again below itself: parents 1 → 2 → 1) is no chain; a host block of
// more device blocks than the offload map may hold is refused, and a store naming more
// than it may hold is cut there. Before, each name walked and appended k hashes
// (around a cycle as well as along a chain) and all went to the index: a 1.9 KB store
// over a two-block device allocated 146 MB.
func TestAHostStoreByHashMapsEachBlockOnceAndStopsAtACycle(t *testing.T) {
	times := func(n int, h uint64) []uint64 { return slices.Repeat([]uint64{h}, n) }
	chain := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(i + 1)
		}
		return out
	}
	reversed := func(s []uint64) []uint64 { slices.Reverse(s); return s }
	cycle := func(h *harness) { // 1 (root), 2 (child of 1), 1 again (child of 2)
		h.apply(0, stored([]uint64{1}, 0, toks(0, testBS)))
		h.apply(0, stored([]uint64{2}, 1, toks(100, testBS)))
		h.apply(0, stored([]uint64{1}, 2, toks(200, testBS)))
	}
	device := func(n int) func(h *harness) {
		return func(h *harness) { h.apply(0, stored(chain(n), 0, toks(0, n*testBS))) }
	}
	tests := []struct {
		name      string
		bound     int // MaxOffloaded
		k         int // device blocks in a host block
		device    func(h *harness)
		names     []uint64 // the host store's hashes
		outcome   string
		offloaded int // blocks in the offload index after
		sent      int // blocks sent to the offload index
	}{
		{"a walk around a cycle is no chain", 2000, 1 << 10, cycle, times(200, 1), outcomeUnknownBlock, 0, 0},
		{"a host block past the bound is refused", 2000, 1 << 14, cycle, times(200, 1), outcomeBlockSize, 0, 0},
		{"a block named 200 times is mapped and sent once", 2000, 1 << 10, device(1 << 10), times(200, 1<<10), outcomeApplied, 1 << 10, 1 << 10},
		{"a chain's blocks named from its end, cut when the walks reach the bound", 4000, 1 << 10, device(1200), reversed(chain(1200)), outcomeApplied, 1200 - 174, 3 << 10},
		{"a chain's blocks named from its root: walks cut short count too", 4000, 1 << 10, device(1200), chain(1200), outcomeUnknownBlock, 0, 0},
		{"a store naming more than the bound is cut there", 10, 4, device(12), []uint64{4, 8, 12}, outcomeApplied, 8, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, func(_ *Config, s *WorkerSpec) { s.MaxEntries, s.MaxOffloaded = 2000, tt.bound })
			sent := &sentIndex{Index: h.idx}
			h.a.idx = sent
			// A first host store of blocks of k turns on the device's chain.
			h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{1 << 40}, BlockSize: tt.k * testBS, Medium: "CPU"})
			tt.device(h)
			deviceEntries := h.a.Entries()
			payload, err := Encode(&Batch{Events: []Event{{Type: TypeBlockStored, BlockHashes: tt.names, BlockSize: tt.k * testBS, Medium: "CPU"}}}, FormMap)
			require.NoError(t, err)
			before := h.count(TypeBlockStored, tt.outcome)
			alloc := allocDuring(func() { require.NoError(t, h.a.Apply(0, payload)) })
			assert.Equal(t, before+1, h.count(TypeBlockStored, tt.outcome), "the host store's outcome")
			assert.Equal(t, tt.offloaded, h.idx.OffloadedEntries("w"))
			assert.Equal(t, tt.sent, sent.offloadStored, "blocks sent to the offload index")
			assert.LessOrEqual(t, h.a.Entries()-deviceEntries, max(tt.bound, tt.sent), "host entries")
			assert.Less(t, alloc, uint64(16<<20), "a %d-byte store allocated %d MB", len(payload), alloc>>20)
		})
	}
}

// The device's chain is kept only once host blocks of several device blocks came (it
// costs ingest): the device blocks stored before cannot be chained, and their host
// blocks are skipped until the device stores them again.
func TestVLLMHostBlocksChainOnlyDeviceBlocksStoredAfterTheFirst(t *testing.T) {
	const k = 4
	h := newHarness(t, 1, nil)
	prompt := toks(0, 8*testBS)
	h.apply(0, stored([]uint64{1, 2, 3, 4}, 0, prompt[:4*testBS]))
	h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{4}, BlockSize: k * testBS, Medium: "CPU"})
	assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnknownBlock), "stored before: no chain")
	h.apply(0, stored([]uint64{5, 6, 7, 8}, 4, prompt[4*testBS:]))
	h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{8}, BlockSize: k * testBS, Medium: "CPU"})
	h.apply(0, removed(1, 2, 3, 4, 5, 6, 7, 8))
	assert.Equal(t, 4, h.idx.OffloadedEntries("w"), "the second host block maps blocks 4 to 7")
	device, run := h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 0}, [2]int{device, run}, "without the first host block the prompt loads nothing")
}

// With kv_events.offload_block_size the chain is kept from the device's first store:
// the host blocks of the first prompt (often a shared system prompt) are not lost.
func TestAConfiguredOffloadBlockSizeChainsFromTheStart(t *testing.T) {
	const k = 4
	h := newHarness(t, 1, func(c *Config, _ *WorkerSpec) { c.OffloadBlockSize = k * testBS })
	prompt := toks(0, 4*testBS)
	h.apply(0, stored([]uint64{1, 2, 3, 4}, 0, prompt))
	h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{4}, Medium: "CPU"}) // block_size 0
	assert.Equal(t, 4, h.idx.OffloadedEntries("w"))
	h.apply(0, removed(1, 2, 3, 4))
	device, run := h.offloaded(prompt)
	assert.Equal(t, [2]int{0, 4}, [2]int{device, run}, "the host block loads as a whole")
}

// TestAHostTierOverflowLeavesTheDeviceBlocks: an engine whose host tier reports more
// than the offload bound loses what it reported there, not its device blocks.
func TestAHostTierOverflowLeavesTheDeviceBlocks(t *testing.T) {
	const capacity = 10
	h := newHarness(t, 1, func(_ *Config, s *WorkerSpec) { s.MaxEntries, s.MaxOffloaded = 2*capacity, 4*capacity })
	device := toks(0, capacity*testBS)
	hashes := make([]uint64, capacity)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	h.apply(0, stored(hashes, 0, device))
	cpu := stored(make([]uint64, 6*capacity), 0, toks(100_000, 6*capacity*testBS))
	for i := range cpu.BlockHashes {
		cpu.BlockHashes[i] = uint64(1000 + i)
	}
	cpu.Medium = "CPU"
	h.apply(0, cpu)
	assert.Equal(t, capacity, h.overlap(device, "", ""), "the device blocks stay")
	assert.Zero(t, h.idx.OffloadedEntries("w"), "the host's are cleared")
	assert.Equal(t, capacity, h.a.Entries())
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonOverflow)))
}

// chunk is an offload tier's store of one chunk of chunkBlocks of kvroute's blocks, as
// LMCache sends it: its own hash, medium "cpu", the previous chunk's hash as parent.
func chunk(hash, parent uint64, tokens []uint32) Event {
	const chunkBlocks = 4
	return Event{Type: TypeBlockStored, BlockHashes: []uint64{hash}, Parent: parent, HasParent: parent != 0,
		TokenIDs: tokens, BlockSize: chunkBlocks * testBS, Medium: "cpu"}
}

func TestOffloadedChunksAreSeveralBlocksLoadedWhole(t *testing.T) {
	const chunkTokens = 4 * testBS
	prompt := toks(0, 4*chunkTokens)
	at := func(c int) []uint32 { return prompt[c*chunkTokens : (c+1)*chunkTokens] }
	// withNext is LMCache's in-process form before its fix of bug #4543: a chunk
	// followed by the next one's first token.
	withNext := func(c int) []uint32 { return prompt[c*chunkTokens : (c+1)*chunkTokens+1] }
	first3 := func(h *harness) {
		h.apply(0, chunk(700, 0, withNext(0)), chunk(701, 700, withNext(1)), chunk(702, 701, at(2)))
	}
	diverging := func(block int) []uint32 {
		return append(slices.Clone(prompt[:block*testBS]), toks(50_000, len(prompt)-block*testBS)...)
	}
	tests := []struct {
		name   string
		then   func(h *harness)
		tokens []uint32
		device int // the device overlap
		run    int // the offloaded run after it
		held   int // blocks in the offload index
	}{
		{"a store call's chunks chain, each four blocks", nil, prompt, 0, 12, 12},
		{"a prompt that differs inside a chunk loads up to its start", nil, diverging(9), 0, 8, 12},
		{"a prompt that differs at a chunk's end loads it all", nil, diverging(8), 0, 8, 12},
		{"a later store's chunk sent with parent 0 is not a root", func(h *harness) {
			zero := chunk(703, 0, at(3))
			zero.ZeroParent = true
			h.apply(0, zero)
			assert.Equal(t, 1.0, h.count(TypeBlockStored, outcomeUnknownParent))
		}, prompt, 0, 12, 12},
		{"a later store's chunk with its parent chains", func(h *harness) {
			h.apply(0, chunk(703, 702, at(3)))
		}, prompt, 0, 16, 16},
		{"removing a chunk removes its four blocks", func(h *harness) {
			gone := removed(701)
			gone.Medium = "CPU"
			h.apply(0, gone)
		}, prompt, 0, 4, 8},
		{"after a device overlap inside a chunk, the run ends at a chunk's end", func(h *harness) {
			h.apply(0, stored([]uint64{1, 2, 3, 4, 5}, 0, prompt[:5*testBS]))
		}, prompt, 5, 7, 12},
		{"a device overlap past the host's chunks leaves no run", func(h *harness) {
			h.apply(0, stored([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 0, prompt[:13*testBS]))
		}, prompt, 13, 0, 12},
		{"the same chunk stored twice is held once", func(h *harness) {
			h.apply(0, chunk(700, 0, at(0)))
		}, prompt, 0, 12, 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			first3(h)
			if tt.then != nil {
				tt.then(h)
			}
			h.checkOffloadedThenClear(tt.tokens, tt.device, tt.run, tt.held, tt.held+tt.device)
		})
	}
}

func TestOffloadedChunksThatAreNotWholeBlocksAreSkipped(t *testing.T) {
	tests := []struct {
		name    string
		event   Event
		outcome string
	}{
		{"a chunk of a block and a half", Event{BlockSize: testBS + testBS/2, TokenIDs: toks(0, testBS+testBS/2)}, outcomeBlockSize},
		{"a partial chunk shorter than a block", Event{BlockSize: testBS / 2, TokenIDs: toks(0, testBS/2)}, outcomeBlockSize},
		{"a chunk with two extra tokens", Event{BlockSize: 2 * testBS, TokenIDs: toks(0, 2*testBS+2)}, outcomeMalformed},
		{"chunks on the device", Event{BlockSize: 2 * testBS, TokenIDs: toks(0, 2*testBS), Medium: "GPU"}, outcomeBlockSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			ev := tt.event
			ev.Type, ev.BlockHashes = TypeBlockStored, []uint64{1}
			if ev.Medium == "" {
				ev.Medium = "cpu"
			}
			h.apply(0, ev)
			assert.Equal(t, 1.0, h.count(TypeBlockStored, tt.outcome))
			assert.Zero(t, h.a.Entries())
			assert.Zero(t, h.idx.OffloadedEntries("w"))
		})
	}
}

func TestTheOffloadBoundCountsAChunksBlocks(t *testing.T) {
	h := newHarness(t, 1, func(_ *Config, s *WorkerSpec) { s.MaxOffloaded = 10 })
	prompt := toks(0, 12*testBS)
	h.apply(0, chunk(700, 0, prompt[:4*testBS]), chunk(701, 700, prompt[4*testBS:8*testBS]))
	assert.Equal(t, 8, h.a.Entries())
	h.apply(0, chunk(702, 701, prompt[8*testBS:]))
	assert.Zero(t, h.a.Entries(), "12 blocks are over the bound of 10, though only 3 engine hashes")
	assert.Zero(t, h.idx.OffloadedEntries("w"))
}

// Review of the chunks (helper-46): each case failed before its fix.
func TestOffloadedChunksEdgeCases(t *testing.T) {
	const ct = 4 * testBS
	p := toks(0, 3*ct)
	t.Run("chunks of two prompts share the blocks before they differ", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		q := append(slices.Clone(p[:6*testBS]), toks(50_000, 2*testBS)...)
		h.apply(0, chunk(700, 0, p[:ct]), chunk(701, 700, p[ct:2*ct]), chunk(801, 700, q[ct:]))
		gone := removed(701)
		gone.Medium = "cpu"
		h.apply(0, gone)
		_, run := h.offloaded(q)
		assert.Equal(t, 8, run, "the other prompt's chunk keeps the blocks they share")
		_, run = h.offloaded(p[:2*ct])
		assert.Equal(t, 4, run)
	})
	t.Run("a shorter last chunk does not shrink the chunks", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		h.apply(0, chunk(700, 0, p[:ct]), chunk(701, 700, p[ct:2*ct]))
		other := toks(90_000, ct+2*testBS)
		partial := chunk(901, 900, other[ct:])
		partial.BlockSize = 2 * testBS
		h.apply(0, chunk(900, 0, other[:ct]), partial)
		_, run := h.offloaded(append(slices.Clone(p[:7*testBS]), toks(50_000, testBS)...))
		assert.Equal(t, 4, run, "a prompt that differs inside chunk 1 loads chunk 0 only")
	})
	t.Run("after a clear the engine's blocks are blocks again", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		h.apply(0, chunk(700, 0, p[:ct]))
		h.apply(0, Event{Type: TypeAllBlocksCleared})
		host := stored([]uint64{1, 2, 3}, 0, p[:3*testBS])
		host.Medium = "cpu"
		h.apply(0, host)
		_, run := h.offloaded(p[:3*testBS])
		assert.Equal(t, 3, run)
		// A new applier of the worker (its subscription rebuilt) says so too.
		h.apply(0, chunk(700, 0, p[:ct]))
		h.a = NewApplier(WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: 1, MaxEntries: 2000}, DefaultConfig(), h.idx, h.metrics, nil)
		h.apply(0, Event{Type: TypeAllBlocksCleared})
		h.apply(0, host)
		_, run = h.offloaded(p[:3*testBS])
		assert.Equal(t, 3, run)
	})
	t.Run("a chunk missing from the host ends the run, whatever the device holds", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		h.apply(0, chunk(700, 0, p[:ct]), chunk(701, 700, p[ct:2*ct]))
		h.apply(0, stored([]uint64{1, 2, 3, 4, 5, 6}, 0, p[:6*testBS]))
		gone := removed(700)
		gone.Medium = "cpu"
		h.apply(0, gone)
		device, run := h.offloaded(p)
		assert.Equal(t, [2]int{6, 0}, [2]int{device, run}, "the engine finds no chunk 0, so it loads nothing")
	})
}

// An engine that never removes (in-process LMCache) keeps its newest chunks: past the
// bound, the mappings of blocks the index's own LRU evicted go, not everything.
func TestOffloadedMapsWithoutRemovalsKeepTheNewest(t *testing.T) {
	h := newHarnessOver(t, index.Config{CapacityBlocks: 2, TTL: time.Minute, PendingTTL: time.Second}, DefaultConfig(), // 8 offloaded blocks
		WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: 1, MaxEntries: 4, MaxOffloaded: 16})
	for i := range 8 {
		prompt := toks(10_000*(i+1), 4*testBS)
		h.apply(0, chunk(uint64(700+i), 0, prompt))
		_, run := h.offloaded(prompt)
		assert.Equal(t, 4, run, "chunk %d", i)
		assert.LessOrEqual(t, h.a.Entries(), 16, "chunk %d", i)
	}
	assert.Zero(t, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonOverflow)), "never cleared")
	assert.Positive(t, testutil.ToFloat64(h.metrics.pruned.WithLabelValues("w")), "the mappings of evicted chunks are counted as they go")
}

// A worker's own offload_block_size (workers[].kv_events) replaces the fleet's, for a
// fleet whose engines offload in blocks of different sizes; 0 leaves the fleet's.
func TestAWorkersOffloadBlockSizeReplacesTheFleets(t *testing.T) {
	tests := []struct {
		name          string
		fleet, worker int // offloaded block sizes in blocks (0: unset)
		run           int // the offloaded run of the 4-block prompt its host block 4 loads
	}{
		{"neither: each host hash is its device block alone", 0, 0, 0},
		{"the fleet's", 4, 0, 4},
		{"the worker's alone", 0, 4, 4},
		{"the worker's over the fleet's", 2, 4, 4},
		{"the fleet's 4 is not this worker's 2", 4, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, func(c *Config, s *WorkerSpec) {
				c.OffloadBlockSize, s.OffloadBlockSize = tt.fleet*testBS, tt.worker*testBS
			})
			prompt := toks(0, 4*testBS)
			h.apply(0, stored([]uint64{1, 2, 3, 4}, 0, prompt))
			h.apply(0, Event{Type: TypeBlockStored, BlockHashes: []uint64{4}, Medium: "CPU"}) // block_size 0
			h.apply(0, removed(1, 2, 3, 4))
			device, run := h.offloaded(prompt)
			assert.Equal(t, [2]int{0, tt.run}, [2]int{device, run})
		})
	}
}

// TestAnEnginesOtherBlockSizeIsWarnedOnce: stores of another block size than kvroute's
// are all refused (counted), so the worker never matches a prompt: a config error,
// logged once per worker with both sizes.
func TestAnEnginesOtherBlockSizeIsWarnedOnce(t *testing.T) {
	h := newHarness(t, 1, nil)
	var logs logbuf.Buffer
	h.a.log = slog.New(slog.NewTextHandler(&logs, nil))
	for i := range 3 {
		ev := stored([]uint64{uint64(2*i + 1), uint64(2*i + 2)}, 0, toks(0, 2*testBS/2))
		ev.BlockSize = testBS / 2
		h.apply(0, ev)
	}
	assert.Equal(t, 3.0, h.count(TypeBlockStored, outcomeBlockSize))
	assert.Equal(t, 1, strings.Count(logs.String(), "not kvroute's size"), logs.String())
	assert.Contains(t, logs.String(), fmt.Sprintf("engine_block_size=%d block_size=%d", testBS/2, testBS))
}
