package index

// Review of the host tiers' second pass (helper-47): each case failed before its fix.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

// The blocks a capacity spills are stored in offloaded deepest first, so the offloaded
// LRU keeps each run's leaves and evicts the block that continues the device overlap.
func TestApproximateOffloadKeepsTheRunsHeadNotItsLeaves(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 4, TTL: time.Minute, PendingTTL: time.Minute, OffloadCapacityBlocks: 6, ApproximateOffload: true}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("w", 0))
	a := []uint64{1, 2, 3, 4}
	require.NoError(t, x.Store("w", a))
	require.NoError(t, x.Store("w", []uint64{11, 12, 13, 14})) // a spilled: offloaded {1,2,3,4}
	require.NoError(t, x.Store("w", []uint64{21, 22, 23, 24})) // b spilled: 2 of a's must go
	run := make([]int, 1)
	x.Offloaded(a, []string{"w"}, x.overlaps(a, "w"), run)
	assert.Equal(t, 2, run[0], "the host keeps a's prefix (the engine's LRU evicts leaves first); got offloaded %v", x.OffloadedEntries("w"))
}

// A worker whose events said its host holds chunks keeps that grain when it falls back
// to approximate mode: its guesses (blocks past the device overlap) are walked from
// block 0 and never count.
func TestGuessesOfAFormerlyChunkedWorkerCount(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := NewEventIndex(Config{CapacityBlocks: 4, TTL: time.Minute, PendingTTL: time.Minute, ApproximateOffload: true}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("w", 0))
	require.NoError(t, x.SetMode("w", ModeEvents))
	x.SetOffloadGrain("w", 4, true)
	require.NoError(t, x.AllBlocksCleared("w")) // the applier's Reset (CheckSilence)
	require.NoError(t, x.SetMode("w", ModeApproximate))
	a := []uint64{1, 2, 3, 4}
	require.NoError(t, x.Store("w", a))
	require.NoError(t, x.Store("w", []uint64{11, 12})) // 3 and 4 spilled
	run := make([]int, 1)
	device := x.overlaps(a, "w")
	x.Offloaded(a, []string{"w"}, device, run)
	assert.Equal(t, [2]int{2, 2}, [2]int{device[0], run[0]})
}

// Store reads the mode, then stores: a worker that enters event mode in between (its
// first batch, SetMode clearing the guesses) is left guesses its engine will never
// remove. The clock hook plays the consumer's SetMode at that point.
func TestNoGuessesOutliveTheSwitchToEvents(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	var x *EventIndex
	switchNow := false
	now := func() time.Time {
		if switchNow {
			switchNow = false
			require.NoError(t, x.SetMode("w", ModeEvents))
		}
		return clock.Now()
	}
	var err error
	x, err = NewEventIndex(Config{CapacityBlocks: 2, TTL: time.Minute, PendingTTL: time.Minute, ApproximateOffload: true}, now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("w", 0))
	require.NoError(t, x.Store("w", []uint64{1, 2}))
	switchNow = true
	require.NoError(t, x.Store("w", []uint64{3, 4})) // SetMode(events) runs inside
	require.Equal(t, ModeEvents, x.Mode("w"))
	assert.Zero(t, x.OffloadedEntries("w"), "guesses of an event worker's host")
}

// A grain told for a worker the index does not know is not kept for a worker added
// later under that name.
func TestAGrainForAnUnknownWorkerIsNotKept(t *testing.T) {
	x, err := NewEventIndex(Config{CapacityBlocks: 10, TTL: time.Minute, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	x.SetOffloadGrain("later", 4, true)
	require.NoError(t, x.SetWorker("later", 0))
	assert.Equal(t, 1, x.OffloadGrain("later"))
	x.SetOffloadGrain("later", 4, true)
	assert.Equal(t, 4, x.OffloadGrain("later"), "a known worker's grain is kept")
}
