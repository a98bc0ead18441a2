package index

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

func newTestIndex(t *testing.T, cfg Config, workers ...string) (*Index, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	x, err := New(cfg, clock.Now)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, x.SetWorker(w, 0))
	}
	return x, clock
}

func chain(ids ...uint64) []uint64 { return ids }

func overlaps(x *Index, hashes []uint64, workers ...string) []int {
	dst := make([]int, len(workers))
	x.Overlaps(hashes, workers, dst)
	return dst
}

func TestOverlapStopsAtFirstMissingBlock(t *testing.T) {
	tests := []struct {
		name   string
		stored []uint64
		query  []uint64
		want   int
	}{
		{"holds the whole prompt", chain(1, 2, 3), chain(1, 2, 3), 3},
		{"holds a longer prompt", chain(1, 2, 3, 4), chain(1, 2), 2},
		{"holds a shorter prefix", chain(1, 2), chain(1, 2, 3, 4), 2},
		{"gap in the middle stops the walk", chain(1, 3, 4), chain(1, 2, 3, 4), 1},
		{"missing first block means no overlap", chain(2, 3), chain(1, 2, 3), 0},
		{"empty request", chain(1, 2), nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, _ := newTestIndex(t, Config{CapacityBlocks: 100}, "w")
			require.NoError(t, x.Store("w", tt.stored))
			assert.Equal(t, []int{tt.want}, overlaps(x, tt.query, "w"))
		})
	}
}

func TestOverlapsPerWorker(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 100}, "a", "b", "c")
	require.NoError(t, x.Store("a", chain(1, 2, 3)))
	require.NoError(t, x.Store("b", chain(1)))
	assert.Equal(t, []int{3, 1, 0, 0}, overlaps(x, chain(1, 2, 3), "a", "b", "c", "unknown"))
	assert.Equal(t, []int{0, 3}, overlaps(x, chain(1, 2, 3), "c", "a"), "order of the workers argument is respected")
}

func TestOverlapsBeyondSixtyFourWorkers(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 10})
	var names []string
	for i := range 150 {
		name := fmt.Sprintf("w%03d", i)
		names = append(names, name)
		require.NoError(t, x.SetWorker(name, 0))
		require.NoError(t, x.Store(name, chain(1, 2, 3)[:i%4]))
	}
	got := overlaps(x, chain(1, 2, 3), names...)
	for i := range names {
		assert.Equal(t, i%4, got[i], names[i])
	}
}

func TestCapacityEvictsLeastRecentlyUsedLeavesFirst(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 4}, "w")
	require.NoError(t, x.Store("w", chain(1, 2, 3))) // prompt A
	require.NoError(t, x.Store("w", chain(10, 11)))  // prompt B: one block must go
	assert.Equal(t, 4, x.WorkerEntries("w"))
	assert.Equal(t, []int{2}, overlaps(x, chain(1, 2, 3), "w"), "A's deepest block goes first, its prefix stays")
	assert.Equal(t, []int{2}, overlaps(x, chain(10, 11), "w"))

	require.NoError(t, x.Store("w", chain(1, 2))) // A used again: B is now oldest
	require.NoError(t, x.Store("w", chain(20)))
	assert.Equal(t, []int{1}, overlaps(x, chain(10, 11), "w"))
	assert.Equal(t, []int{2}, overlaps(x, chain(1, 2), "w"))
	assert.Equal(t, 4, x.Entries())
}

func TestStoreLongerThanCapacityKeepsLeadingBlocks(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 3}, "w")
	require.NoError(t, x.Store("w", chain(1, 2, 3, 4, 5)))
	assert.Equal(t, []int{3}, overlaps(x, chain(1, 2, 3, 4, 5), "w"))
	assert.Equal(t, 3, x.Entries())
}

func TestMemoryBoundedWhateverTheTraffic(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 50}, "a", "b")
	for i := range uint64(10_000) {
		require.NoError(t, x.Store([]string{"a", "b"}[i%2], chain(i*3, i*3+1, i*3+2)))
	}
	assert.Equal(t, 100, x.Entries())
	assert.Equal(t, 50, x.WorkerEntries("a"))
	for _, g := range x.groups {
		assert.LessOrEqual(t, g.len(), 100, "no stale hashes are left in the shared map")
	}
}

func TestTTLForgetsBlocksNotStoredRecently(t *testing.T) {
	x, clock := newTestIndex(t, Config{CapacityBlocks: 100, TTL: time.Minute}, "w")
	require.NoError(t, x.Store("w", chain(1, 2)))
	clock.Advance(40 * time.Second)
	require.NoError(t, x.Store("w", chain(1, 2, 3))) // refreshes 1 and 2
	clock.Advance(40 * time.Second)
	assert.Equal(t, []int{3}, overlaps(x, chain(1, 2, 3), "w"), "refreshed blocks live on")
	clock.Advance(21 * time.Second)
	assert.Equal(t, []int{0}, overlaps(x, chain(1, 2, 3), "w"), "a lookup alone expires old blocks")
	assert.Equal(t, 0, x.Entries())
}

func TestZeroTTLNeverExpires(t *testing.T) {
	x, clock := newTestIndex(t, Config{CapacityBlocks: 100}, "w")
	require.NoError(t, x.Store("w", chain(1, 2)))
	clock.Advance(1000 * time.Hour)
	assert.Equal(t, []int{2}, overlaps(x, chain(1, 2), "w"))
}

func TestRemoveClearAndRemoveWorker(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 100}, "a", "b")
	require.NoError(t, x.Store("a", chain(1, 2, 3)))
	require.NoError(t, x.Store("b", chain(1, 2, 3)))

	require.NoError(t, x.Remove("a", chain(2, 99)))
	assert.Equal(t, []int{1, 3}, overlaps(x, chain(1, 2, 3), "a", "b"))

	require.NoError(t, x.Clear("b"))
	assert.Equal(t, []int{1, 0}, overlaps(x, chain(1, 2, 3), "a", "b"))
	assert.Equal(t, 2, x.Entries())

	x.RemoveWorker("a")
	assert.Equal(t, 0, x.Entries())
	assert.Zero(t, x.groups[0].len(), "a removed worker leaves nothing behind")
	assert.ErrorIs(t, x.Store("a", chain(1)), ErrUnknownWorker)

	require.NoError(t, x.SetWorker("c", 0))
	assert.Equal(t, []int{0}, overlaps(x, chain(1), "c"), "a reused slot starts empty")
}

func TestSetWorkerShrinksCapacity(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 100}, "w")
	require.NoError(t, x.Store("w", chain(1, 2, 3, 4)))
	require.NoError(t, x.SetWorker("w", 2))
	assert.Equal(t, []int{2}, overlaps(x, chain(1, 2, 3, 4), "w"))
	assert.Error(t, x.SetWorker("w", -1))
}

func TestConfigValidateNamesTheField(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"zero capacity", Config{CapacityBlocks: 0}, "index.capacity_blocks"},
		{"negative ttl", Config{CapacityBlocks: 1, TTL: -time.Second}, "index.ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	require.NoError(t, DefaultConfig().Validate())
}

func TestConcurrentStoresAndLookups(t *testing.T) {
	x, clock := newTestIndex(t, Config{CapacityBlocks: 64, TTL: time.Second}, "a", "b", "c")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			dst := make([]int, 3)
			for i := range uint64(2000) {
				h := chain(i%7, i%7+100, i%7+200)
				switch (int(i) + g) % 4 {
				case 0:
					_ = x.Store([]string{"a", "b", "c"}[i%3], h)
				case 1:
					_ = x.Remove("b", h[1:])
				case 2:
					clock.Advance(time.Millisecond)
					fallthrough
				default:
					x.Overlaps(h, []string{"a", "b", "c"}, dst)
					for _, ov := range dst {
						if ov < 0 || ov > 3 {
							t.Errorf("overlap %d out of range", ov)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, x.Entries(), 3*64)
}

func TestFootprintsReportHeldBlocksAndCapacity(t *testing.T) {
	x, _ := newTestIndex(t, Config{CapacityBlocks: 100}, "a")
	require.NoError(t, x.SetWorker("small", 3))
	require.NoError(t, x.Store("a", chain(1, 2, 3)))
	require.NoError(t, x.Store("small", chain(1, 2, 3, 4, 5)))
	workers := []string{"a", "small", "unknown"}
	held, capacity := make([]int, 3), []int{9, 9, 9}
	x.Footprints(workers, held, capacity)
	assert.Equal(t, []int{3, 3, 0}, held, "capped by capacity; unknown workers hold nothing")
	assert.Equal(t, []int{100, 3, 0}, capacity)
}

func TestSetWorkerTTLGivesOneWorkerItsOwnTTL(t *testing.T) {
	clock := fakeclock.New(time.Unix(1000, 0))
	x, err := New(Config{CapacityBlocks: 10, TTL: time.Minute}, clock.Now)
	require.NoError(t, err)
	require.NoError(t, x.SetWorker("short", 0))
	require.NoError(t, x.SetWorker("long", 0))
	require.NoError(t, x.SetWorker("forever", 0))
	require.NoError(t, x.SetWorkerTTL("short", time.Second))
	require.NoError(t, x.SetWorkerTTL("forever", 0))
	for _, w := range []string{"short", "long", "forever"} {
		require.NoError(t, x.Store(w, []uint64{1, 2}))
	}
	clock.Advance(2 * time.Second)
	assert.Equal(t, []int{0, 2, 2}, []int{x.WorkerEntries("short"), x.WorkerEntries("long"), x.WorkerEntries("forever")})
	clock.Advance(time.Hour)
	assert.Equal(t, []int{0, 0, 2}, []int{x.WorkerEntries("short"), x.WorkerEntries("long"), x.WorkerEntries("forever")})

	require.NoError(t, x.SetWorkerTTL("forever", time.Second))
	assert.Zero(t, x.WorkerEntries("forever"), "blocks older than a shortened TTL go at the next lookup")
	assert.ErrorIs(t, x.SetWorkerTTL("nobody", time.Second), ErrUnknownWorker)
	assert.Error(t, x.SetWorkerTTL("long", -time.Second))
}

// A TTL that the config accepts keeps blocks for at least as long as it says, however
// long: a store's expiry past the int64 nanoseconds of time.Time's range saturates
// rather than wrapping negative (which forgot every block at once).
func TestALongTTLDoesNotWrapAround(t *testing.T) {
	for _, ttl := range []time.Duration{250 * 365 * 24 * time.Hour, math.MaxInt64} {
		x, clock := newTestIndex(t, Config{CapacityBlocks: 100, TTL: ttl}, "w")
		require.NoError(t, x.Store("w", chain(1, 2)))
		clock.Advance(time.Hour)
		assert.Equal(t, []int{2}, overlaps(x, chain(1, 2), "w"), "ttl %s", ttl)
		assert.Equal(t, 2, x.Entries(), "ttl %s", ttl)
	}
}
