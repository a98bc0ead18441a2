package index

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

func newEventIndex(t *testing.T, workers ...string) (*EventIndex, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 100, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, x.SetWorker(w, 0))
		require.NoError(t, x.SetMode(w, ModeEvents))
	}
	return x, clock
}

func (x *EventIndex) overlaps(hashes []uint64, workers ...string) []int {
	dst := make([]int, len(workers))
	x.Overlaps(hashes, workers, dst)
	return dst
}

func (x *EventIndex) held(workers ...string) []int {
	held, capacity := make([]int, len(workers)), make([]int, len(workers))
	x.Footprints(workers, held, capacity)
	return held
}

func TestEventIndexCountsADecisionUntilTheEngineConfirmsIt(t *testing.T) {
	x, clock := newEventIndex(t, "a", "b")
	prompt := []uint64{1, 2, 3, 4}

	require.NoError(t, x.Store("a", prompt))
	assert.Equal(t, []int{4, 0}, x.overlaps(prompt, "a", "b"), "the chosen worker holds the prompt before any event")
	assert.Equal(t, []int{4, 0}, x.held("a", "b"))

	require.NoError(t, x.BlockStored("a", prompt[:3]))
	assert.Equal(t, []int{4, 0}, x.overlaps(prompt, "a", "b"), "the walk runs through confirmed then pending blocks")
	assert.Equal(t, []int{4, 0}, x.held("a", "b"), "a confirmed block is no longer also pending")
	confirmed, pending := x.Entries()
	assert.Equal(t, [2]int{3, 1}, [2]int{confirmed, pending})

	clock.Advance(2 * time.Second)
	assert.Equal(t, []int{3, 0}, x.overlaps(prompt, "a", "b"), "a block never confirmed is forgotten after the pending TTL")
	assert.Equal(t, []int{3, 0}, x.held("a", "b"))
}

func TestEventIndexUnrecordForgetsTheDecisionsBlocksNotTheEnginesReports(t *testing.T) {
	x, _ := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	require.NoError(t, x.Store("a", []uint64{1, 2, 3, 4}))
	require.Equal(t, []int{4}, x.overlaps([]uint64{1, 2, 3, 4}, "a"))

	require.NoError(t, x.Unrecord("a", []uint64{1, 2, 3, 4}))
	assert.Equal(t, []int{2}, x.overlaps([]uint64{1, 2, 3, 4}, "a"), "what the engine reported stays")
	assert.Equal(t, []int{2}, x.held("a"))
	assert.ErrorIs(t, x.Unrecord("gone", []uint64{1}), ErrUnknownWorker)
}

// A request served elsewhere never reaches the chosen worker's engine, which will
// report none of the blocks the decision sent it: once they are forgotten (Unrecord),
// the worker owes no event for them, else the silence watchdog takes an engine whose
// stream is fine for silent and clears what it reported. Blocks another decision sent
// it are still owed.
func TestEventIndexUnrecordedBlocksAreNoLongerOwed(t *testing.T) {
	x, clock := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	x.Heard("a")
	require.NoError(t, x.Store("a", []uint64{1, 2, 3, 4}))
	_, owed := x.Awaiting("a")
	require.True(t, owed)
	require.NoError(t, x.Unrecord("a", []uint64{3, 4}))
	_, owed = x.Awaiting("a")
	assert.False(t, owed, "the only blocks owed were forgotten")

	start := clock.Now()
	require.NoError(t, x.Store("a", []uint64{1, 2, 5}))
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, x.Store("a", []uint64{1, 2, 6, 7}))
	require.NoError(t, x.Unrecord("a", []uint64{6, 7}))
	since, owed := x.Awaiting("a")
	assert.True(t, owed, "another decision's block is still owed")
	assert.Equal(t, start, since)
}

func TestEventIndexPendsOnlyWhatTheWorkerLacks(t *testing.T) {
	x, clock := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	require.NoError(t, x.Store("a", []uint64{1, 2, 3}))
	assert.Equal(t, []int{3}, x.held("a"), "the prefix the engine already reported is not counted twice")
	require.NoError(t, x.BlockRemoved("a", []uint64{2}))
	assert.Equal(t, []int{1}, x.overlaps([]uint64{1, 2, 3}, "a"), "an eviction cuts the walk even where a later block is pending")
	clock.Advance(2 * time.Second)
	assert.Equal(t, []int{1}, x.held("a"))
}

func TestEventIndexWalksEachWorkerFromItsOwnConfirmedPrefix(t *testing.T) {
	x, _ := newEventIndex(t, "a", "b", "c")
	prompt := []uint64{1, 2, 3, 4, 5}
	require.NoError(t, x.BlockStored("a", prompt[:2]))
	require.NoError(t, x.Store("a", prompt[:4]))
	require.NoError(t, x.BlockStored("b", prompt[:1]))
	require.NoError(t, x.Store("c", prompt))
	assert.Equal(t, []int{4, 1, 5}, x.overlaps(prompt, "a", "b", "c"))
}

func TestEventIndexClearAndRemoveWorker(t *testing.T) {
	x, _ := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1}))
	require.NoError(t, x.Store("a", []uint64{1, 2}))
	require.NoError(t, x.AllBlocksCleared("a"))
	assert.Equal(t, []int{0}, x.held("a"), "a cleared engine holds nothing, pending included")
	require.NoError(t, x.Store("a", []uint64{1}))
	x.RemoveWorker("a")
	assert.Equal(t, []int{0}, x.held("a"))
	assert.ErrorIs(t, x.BlockStored("a", []uint64{1}), ErrUnknownWorker)
	assert.ErrorIs(t, x.Store("a", []uint64{1}), ErrUnknownWorker)
	assert.ErrorIs(t, x.AllBlocksCleared("a"), ErrUnknownWorker)
}

func TestNewEventIndexRejectsBadConfig(t *testing.T) {
	_, err := NewEventIndex(Config{CapacityBlocks: 10}, nil)
	assert.ErrorContains(t, err, "index.pending_ttl")
	_, err = NewEventIndex(Config{PendingTTL: time.Second}, nil)
	assert.ErrorContains(t, err, "index.capacity_blocks")
}

func TestEventIndexServesApproximateAndEventWorkersTogether(t *testing.T) {
	x, clock := newEventIndex(t, "events")
	require.NoError(t, x.SetWorker("approx", 0))
	assert.Equal(t, ModeApproximate, x.Mode("approx"), "a new worker is approximate until its events are subscribed")
	prompt := []uint64{1, 2, 3}
	require.NoError(t, x.Store("events", prompt))
	require.NoError(t, x.Store("approx", prompt))
	clock.Advance(2 * time.Second)
	assert.Equal(t, []int{0, 3}, x.overlaps(prompt, "events", "approx"),
		"an event worker's unconfirmed decision lapses after the pending TTL; an approximate worker's lasts the TTL")
	clock.Advance(time.Minute)
	assert.Equal(t, []int{0, 0}, x.overlaps(prompt, "events", "approx"))
}

func TestEventIndexModeSwitches(t *testing.T) {
	x, clock := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	require.NoError(t, x.SetMode("a", ModeApproximate))
	assert.Equal(t, []int{0}, x.overlaps([]uint64{1, 2}, "a"), "falling back forgets what the silent engine reported")
	require.NoError(t, x.Store("a", []uint64{1, 2, 3}))
	clock.Advance(10 * time.Second)
	assert.Equal(t, []int{3}, x.overlaps([]uint64{1, 2, 3}, "a"), "approximate decisions last the long TTL")
	require.NoError(t, x.SetMode("a", ModeEvents))
	assert.Equal(t, []int{0}, x.overlaps([]uint64{1, 2, 3}, "a"), "back in event mode, decisions older than the pending TTL go")
	assert.ErrorIs(t, x.SetMode("nobody", ModeEvents), ErrUnknownWorker)
	assert.Equal(t, "events", ModeEvents.String())
	assert.Equal(t, "approximate", x.Mode("nobody").String())
}

func TestEventIndexAwaitsEventsOnlyForUnreportedBlocks(t *testing.T) {
	x, clock := newEventIndex(t, "a")
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	require.NoError(t, x.Store("a", []uint64{1, 2}))
	_, owed := x.Awaiting("a")
	assert.False(t, owed, "a prompt the engine already reported owes no event")

	start := clock.Now()
	require.NoError(t, x.Store("a", []uint64{1, 2, 3}))
	clock.Advance(time.Second)
	require.NoError(t, x.Store("a", []uint64{1, 2, 4}))
	since, owed := x.Awaiting("a")
	assert.True(t, owed)
	assert.Equal(t, start, since, "the first decision since the last event counts")
	x.Heard("a")
	_, owed = x.Awaiting("a")
	assert.False(t, owed)

	require.NoError(t, x.SetWorker("approx", 0))
	require.NoError(t, x.Store("approx", []uint64{9}))
	_, owed = x.Awaiting("approx")
	assert.False(t, owed, "an approximate worker owes no events")
}

func (x *EventIndex) offloadedRuns(hashes []uint64, workers ...string) (device, offloaded []int) {
	device = x.overlaps(hashes, workers...)
	offloaded = make([]int, len(workers))
	x.Offloaded(hashes, workers, device, offloaded)
	return device, offloaded
}

func TestEventIndexOffloadedBlocksContinueTheDeviceRun(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4, 5, 6}
	tests := []struct {
		name                string
		device, host        map[string][]uint64
		removeHost          map[string][]uint64
		wantDevice, wantRun []int // for workers a, b, c
	}{
		{"nothing offloaded: no run", map[string][]uint64{"a": {1, 2}}, nil, nil, []int{2, 0, 0}, []int{0, 0, 0}},
		{"the host run starts where the device run stops",
			map[string][]uint64{"a": {1, 2}}, map[string][]uint64{"a": {1, 2, 3, 4, 5}, "b": {1, 2, 3}},
			nil, []int{2, 0, 0}, []int{3, 3, 0}},
		{"a host run that does not continue the device run counts nothing",
			map[string][]uint64{"a": {1, 2}}, map[string][]uint64{"a": {4, 5}, "c": {2, 3}},
			nil, []int{2, 0, 0}, []int{0, 0, 0}},
		{"a whole prompt on device leaves nothing to load",
			map[string][]uint64{"a": prompt}, map[string][]uint64{"a": prompt}, nil, []int{6, 0, 0}, []int{0, 0, 0}},
		{"an offloaded block removed by the engine cuts the run",
			map[string][]uint64{"a": {1}}, map[string][]uint64{"a": {1, 2, 3, 4}},
			map[string][]uint64{"a": {3}}, []int{1, 0, 0}, []int{1, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, _ := newEventIndex(t, "a", "b", "c")
			for w, hs := range tt.device {
				require.NoError(t, x.BlockStored(w, hs))
			}
			for w, hs := range tt.host {
				require.NoError(t, x.OffloadStored(w, hs))
			}
			for w, hs := range tt.removeHost {
				require.NoError(t, x.OffloadRemoved(w, hs))
			}
			device, run := x.offloadedRuns(prompt, "a", "b", "c")
			assert.Equal(t, tt.wantDevice, device, "offloaded blocks never count as held on device")
			assert.Equal(t, tt.wantRun, run)
			held := x.held("a", "b", "c")
			for i, w := range []string{"a", "b", "c"} {
				assert.Equal(t, len(tt.device[w]), held[i], "%s: offloaded blocks are not in the device footprint", w)
			}
		})
	}
}

func TestEventIndexForgetsOffloadedBlocksWhenItCannotVouchForThem(t *testing.T) {
	prompt := []uint64{1, 2, 3}
	for _, tt := range []struct {
		name   string
		forget func(x *EventIndex) error
	}{
		{"AllBlocksCleared", func(x *EventIndex) error { return x.AllBlocksCleared("a") }},
		{"back to approximate mode (the events stopped)", func(x *EventIndex) error { return x.SetMode("a", ModeApproximate) }},
		{"worker removed and added again", func(x *EventIndex) error { x.RemoveWorker("a"); return x.SetWorker("a", 0) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x, _ := newEventIndex(t, "a")
			require.NoError(t, x.OffloadStored("a", prompt))
			require.Equal(t, 3, x.OffloadedEntries("a"))
			require.NoError(t, tt.forget(x))
			_, run := x.offloadedRuns(prompt, "a")
			assert.Equal(t, []int{0}, run)
			assert.Zero(t, x.OffloadedEntries("a"))
		})
	}
}

func TestEventIndexBoundsEachWorkersOffloadedBlocks(t *testing.T) {
	for _, tt := range []struct {
		name       string
		configured int
		want       int
	}{
		{"0 keeps DefaultOffloadFactor times the worker's capacity", 0, DefaultOffloadFactor * 10},
		{"a configured bound is kept whatever the capacity", 7, 7},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x, err := NewEventIndex(Config{CapacityBlocks: 100, PendingTTL: time.Second, OffloadCapacityBlocks: tt.configured}, nil)
			require.NoError(t, err)
			require.NoError(t, x.SetWorker("a", 10))
			hashes := make([]uint64, 1000)
			for i := range hashes {
				hashes[i] = uint64(i + 1)
			}
			for i := 0; i < len(hashes); i += 50 {
				require.NoError(t, x.OffloadStored("a", hashes[i:i+50]))
			}
			assert.Equal(t, tt.want, x.OffloadedEntries("a"))
		})
	}
	_, err := NewEventIndex(Config{CapacityBlocks: 100, PendingTTL: time.Second, OffloadCapacityBlocks: -1}, nil)
	assert.ErrorContains(t, err, "index.offload_capacity_blocks")
}

// With ApproximateOffload, what an approximate worker's capacity evicts from the
// router's decisions is kept as offloaded: its engine wrote it to host memory.
func TestApproximateOffloadKeepsWhatTheCapacityEvicts(t *testing.T) {
	a, b := []uint64{1, 2, 3, 4}, []uint64{11, 12, 13}
	tests := []struct {
		name    string
		offload bool
		mode    Mode
		// device and run of a after b pushed it out of the worker's 4 blocks
		device, run int
		offloaded   int
	}{
		{"an approximate worker's evicted blocks are offloaded", true, ModeApproximate, 1, 3, 3},
		{"without the option they are forgotten", false, ModeApproximate, 1, 0, 0},
		{"an event worker's pending blocks are not guesses of its host", true, ModeEvents, 1, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := fakeclock.New(time.Unix(1000, 0))
			x, err := NewEventIndex(Config{CapacityBlocks: 4, TTL: time.Minute, PendingTTL: time.Minute, ApproximateOffload: tt.offload}, clock.Now)
			require.NoError(t, err)
			require.NoError(t, x.SetWorker("w", 0))
			require.NoError(t, x.SetMode("w", tt.mode))
			require.NoError(t, x.Store("w", a))
			require.NoError(t, x.Store("w", b)) // a's three deepest blocks make room
			device := x.overlaps(a, "w")
			run := make([]int, 1)
			x.Offloaded(a, []string{"w"}, device, run)
			assert.Equal(t, [2]int{tt.device, tt.run}, [2]int{device[0], run[0]})
			assert.Equal(t, tt.offloaded, x.OffloadedEntries("w"))
			assert.Equal(t, []int{4}, x.held("w"), "the device footprint stays the capacity")
		})
	}
}

func TestApproximateOffloadGuessesGoWhenTheEnginesEventsStart(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 2, TTL: time.Minute, PendingTTL: time.Second, ApproximateOffload: true}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("w", 0))
	require.NoError(t, x.Store("w", []uint64{1, 2}))
	require.NoError(t, x.Store("w", []uint64{3, 4}))
	require.Equal(t, 2, x.OffloadedEntries("w"))
	require.NoError(t, x.SetMode("w", ModeEvents))
	assert.Zero(t, x.OffloadedEntries("w"), "the engine reports its host memory now")
}

// A worker whose host holds chunks (SetOffloadGrain) gets the whole chunks its host
// holds from the prompt's start, past its device overlap; other workers are walked as
// before.
func TestOffloadedRunsOfChunkedWorkersAreWholeChunksFromTheStart(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name   string
		host   []uint64 // offloaded blocks
		grain  int
		device int // the device overlap
		want   int
	}{
		{"blocks: the run after the device", prompt[:7], 1, 2, 5},
		{"chunks of 4: cut to a chunk's end", prompt[:7], 4, 2, 2},
		{"chunks of 4: all of two", prompt[:8], 4, 0, 8},
		{"chunks of 4: past a device overlap inside chunk 1", prompt[:8], 4, 5, 3},
		{"chunks of 4: chunk 0 missing ends it", prompt[4:8], 4, 4, 0},
		{"chunks of 4: the device holds more than the host", prompt[:4], 4, 6, 0},
		{"back to blocks", prompt[4:8], 1, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, _ := newEventIndex(t, "w", "other")
			require.NoError(t, x.OffloadStored("w", tt.host))
			require.NoError(t, x.OffloadStored("other", tt.host))
			x.SetOffloadGrain("w", 4, true)
			x.SetOffloadGrain("w", tt.grain, true)
			dst := make([]int, 2)
			x.Offloaded(prompt, []string{"w", "other"}, []int{tt.device, tt.device}, dst)
			assert.Equal(t, tt.want, dst[0])
			other := 0
			for i := tt.device; i < len(prompt) && slices.Contains(tt.host, prompt[i]); i++ {
				other++
			}
			assert.Equal(t, other, dst[1], "a worker without chunks walks from its device overlap")
		})
	}
}

// A decision refreshes the offloaded run its worker holds, as the engine's lookup
// refreshes its host LRU: the next host stores evict colder blocks first.
func TestADecisionKeepsTheOffloadedRunItUsesRecent(t *testing.T) {
	for _, decided := range []bool{true, false} {
		clock := fakeclock.New(time.Unix(1000, 0))
		x, err := NewEventIndex(Config{CapacityBlocks: 2, PendingTTL: time.Second}, clock.Now) // 8 offloaded blocks
		require.NoError(t, err)
		require.NoError(t, x.SetWorker("w", 0))
		require.NoError(t, x.SetMode("w", ModeEvents))
		hot, cold := []uint64{1, 2, 3, 4}, []uint64{5, 6, 7, 8}
		require.NoError(t, x.OffloadStored("w", hot))
		require.NoError(t, x.OffloadStored("w", cold))
		if decided {
			require.NoError(t, x.Store("w", hot))
		}
		require.NoError(t, x.OffloadStored("w", []uint64{9, 10, 11, 12}))
		run := make([]int, 1)
		x.Offloaded(hot, []string{"w"}, []int{0}, run)
		want := 0
		if decided {
			want = 4
		}
		assert.Equal(t, want, run[0], "decided %v", decided)
	}
}

// A worker whose host holds vLLM's offloaded blocks of k of kvroute's (SetOffloadGrain
// with fromStart false) gets the whole chunks its host holds from the one containing
// the end of its device overlap, as vLLM's OffloadingConnector looks them up: a chunk
// before it missing from the host does not matter, and the run ends at a chunk's end.
func TestOffloadedRunsOfVLLMChunksStartAtTheDeviceOverlapsChunk(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	tests := []struct {
		name   string
		host   []uint64 // offloaded blocks
		device int      // the device overlap
		want   int
	}{
		{"no device hit: whole chunks from the start", prompt[:10], 0, 8},
		{"chunk 0 missing, the device holding it: the run starts at chunk 1", prompt[4:12], 4, 8},
		{"a device overlap inside chunk 1: its rest and chunk 2", prompt[4:12], 6, 6},
		{"less than a chunk to load: vLLM loads nothing", prompt[4:8], 6, 0},
		{"a device overlap inside a chunk the host lacks: nothing", prompt[8:12], 6, 0},
		{"a device overlap at the host's last chunk's end: nothing", prompt[:8], 8, 0},
		{"a run that ends inside a chunk is cut to the one before, less than a chunk: nothing", prompt[4:11], 5, 0},
		{"a run that ends inside a chunk is cut to the one before", prompt[4:11], 4, 4},
		{"a device overlap past the prompt: nothing", prompt, len(prompt), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, _ := newEventIndex(t, "w", "lmcache")
			require.NoError(t, x.OffloadStored("w", tt.host))
			require.NoError(t, x.OffloadStored("lmcache", tt.host))
			x.SetOffloadGrain("w", 4, false)
			x.SetOffloadGrain("lmcache", 4, true)
			dst := make([]int, 2)
			x.Offloaded(prompt, []string{"w", "lmcache"}, []int{tt.device, tt.device}, dst)
			assert.Equal(t, tt.want, dst[0])
			lmcache := 0
			if slices.Contains(tt.host, prompt[0]) {
				n := 0
				for n < len(prompt) && slices.Contains(tt.host, prompt[n]) {
					n++
				}
				lmcache = max(n/4*4-tt.device, 0)
			}
			assert.Equal(t, lmcache, dst[1], "a worker whose chunks are looked up from the start")
			assert.Equal(t, 4, x.OffloadGrain("w"))
		})
	}
}

// TestClearingAWorkerThatHoldsNothingMakesNoNewTable: an engine may send thousands of
// AllBlocksCleared in one batch. Each used to give each of the worker's three stores a
// new table, its shards sized by the capacity (~100 KB per clear at a million blocks):
// 262,144 clears allocated 27 GB. A clear of a worker that holds nothing since its
// last clear now allocates nothing; one that holds blocks still forgets them all.
func TestClearingAWorkerThatHoldsNothingMakesNoNewTable(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 1 << 20, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("a", 0))
	require.NoError(t, x.BlockStored("a", []uint64{1, 2}))
	require.NoError(t, x.Store("a", []uint64{1, 2, 3}))
	require.NoError(t, x.AllBlocksCleared("a"))
	assert.Equal(t, []int{0}, x.held("a"), "the first clear forgets every block")
	assert.Zero(t, testing.AllocsPerRun(100, func() { require.NoError(t, x.AllBlocksCleared("a")) }),
		"clearing a worker that holds nothing allocates")
	require.NoError(t, x.BlockStored("a", []uint64{1}))
	require.NoError(t, x.AllBlocksCleared("a"))
	assert.Equal(t, []int{0}, x.held("a"), "a clear after new blocks forgets them")
}
