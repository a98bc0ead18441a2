package index

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

func newEventIndex(t *testing.T, workers ...string) (*EventIndex, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 100}, time.Second, clock.Now)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, x.SetWorker(w, 0))
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
	_, err := NewEventIndex(Config{CapacityBlocks: 10}, 0, nil)
	assert.ErrorContains(t, err, "index.pending_ttl")
	_, err = NewEventIndex(Config{}, time.Second, nil)
	assert.ErrorContains(t, err, "index.capacity_blocks")
}
