package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

// modelIndex is the reference an Index is held to: per worker, a plain list of held
// hashes, least recently used first, each with the time it was last stored.
type modelIndex struct {
	defaultCapacity int
	defaultTTL      time.Duration
	workers         map[string]*modelWorker
}

type modelWorker struct {
	capacity int
	ttl      time.Duration
	held     []modelEntry // oldest first
}

type modelEntry struct {
	hash    uint64
	touched time.Time
}

func (m *modelIndex) find(w *modelWorker, h uint64) int {
	return slices.IndexFunc(w.held, func(e modelEntry) bool { return e.hash == h })
}

func (m *modelIndex) expire(now time.Time) {
	for _, w := range m.workers {
		if w.ttl > 0 {
			w.held = slices.DeleteFunc(w.held, func(e modelEntry) bool { return !e.touched.Add(w.ttl).After(now) })
		}
	}
}

func (m *modelIndex) setWorker(name string, capacity int) {
	if capacity == 0 {
		capacity = m.defaultCapacity
	}
	if w, ok := m.workers[name]; ok {
		w.capacity = capacity
		if len(w.held) > capacity {
			w.held = slices.Delete(w.held, 0, len(w.held)-capacity)
		}
		return
	}
	m.workers[name] = &modelWorker{capacity: capacity, ttl: m.defaultTTL}
}

func (m *modelIndex) store(name string, hashes []uint64, now time.Time) bool {
	m.expire(now)
	w, ok := m.workers[name]
	if !ok {
		return false
	}
	hashes = hashes[:min(len(hashes), w.capacity)]
	for i := len(hashes) - 1; i >= 0; i-- {
		if at := m.find(w, hashes[i]); at >= 0 {
			w.held = slices.Delete(w.held, at, at+1)
		} else if len(w.held) >= w.capacity {
			w.held = slices.Delete(w.held, 0, 1)
		}
		w.held = append(w.held, modelEntry{hash: hashes[i], touched: now})
	}
	return true
}

func (m *modelIndex) overlap(name string, hashes []uint64) int {
	w, ok := m.workers[name]
	if !ok {
		return 0
	}
	n := 0
	for n < len(hashes) && m.find(w, hashes[n]) >= 0 {
		n++
	}
	return n
}

// TestIndexAgreesWithAReferenceModel runs seeded random stores, removes, clears,
// worker additions and removals (so slots are reused, across more than one group of 64),
// capacity and TTL changes and clock steps against an Index and a plain model side by
// side, and compares every answer the Index gives: overlaps, entries, per-worker entries
// and footprints. It also checks that the groups' tables hold, for each hash, exactly
// the bits of the workers that hold it, so nothing stale is left behind. Hashes come
// from a small universe (with 0, which the tables keep aside) so table runs collide,
// wrap around and are shifted back by deletes and shrinks.
func TestIndexAgreesWithAReferenceModel(t *testing.T) {
	for _, tc := range []struct {
		capacity int
		ttl      time.Duration
		universe uint64
	}{
		{capacity: 40, universe: 120},
		{capacity: 40, ttl: 10 * time.Second, universe: 120},
		{capacity: 100, ttl: time.Minute, universe: 2000},  // two shards per group
		{capacity: 1000, ttl: time.Minute, universe: 3000}, // sixteen shards per group
	} {
		for seed := range uint64(2) {
			t.Run(fmt.Sprintf("capacity=%d/ttl=%s/seed=%d", tc.capacity, tc.ttl, seed), func(t *testing.T) {
				runIndexModel(t, tc.capacity, tc.ttl, tc.universe, seed)
			})
		}
	}
}

func runIndexModel(t *testing.T, capacity int, ttl time.Duration, universe, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(capacity)))
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	x, err := New(Config{CapacityBlocks: capacity, TTL: ttl}, clock.Now)
	require.NoError(t, err)
	model := &modelIndex{defaultCapacity: capacity, defaultTTL: ttl, workers: map[string]*modelWorker{}}

	names := make([]string, 80) // more than one group of 64 slots
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	hash := func() uint64 {
		h := rng.Uint64N(universe)
		if h%3 == 1 {
			h <<= 40 // hashes differing only in high bits
		}
		return h
	}
	// Prompts share prefixes, as conversations do, so overlaps are long; with a small
	// capacity, longer than it.
	prompts := make([][]uint64, 12)
	for i := range prompts {
		prompts[i] = make([]uint64, 1+rng.IntN(min(2*capacity, 150)))
		for j := range prompts[i] {
			prompts[i][j] = hash()
		}
	}
	chainOf := func() []uint64 {
		p := prompts[rng.IntN(len(prompts))]
		c := slices.Clone(p[:rng.IntN(len(p)+1)])
		for n := rng.IntN(4); n > 0; n-- {
			c = append(c, hash())
		}
		return c
	}
	for _, name := range names[:40] {
		require.NoError(t, x.SetWorker(name, 0))
		model.setWorker(name, 0)
	}

	for op := range 3000 {
		name := names[rng.IntN(len(names))]
		_, known := model.workers[name]
		switch r := rng.IntN(100); {
		case r < 50:
			hashes := chainOf()
			err := x.Store(name, hashes)
			require.Equal(t, model.store(name, hashes, clock.Now()), err == nil, "op %d: Store(%s): %v", op, name, err)
		case r < 60:
			var hashes []uint64
			if w, ok := model.workers[name]; ok && len(w.held) > 0 {
				for n := 1 + rng.IntN(5); n > 0; n-- {
					hashes = append(hashes, w.held[rng.IntN(len(w.held))].hash)
				}
			}
			hashes = append(hashes, hash())
			err := x.Remove(name, hashes)
			require.Equal(t, known, err == nil, "op %d: Remove(%s)", op, name)
			if w, ok := model.workers[name]; ok {
				w.held = slices.DeleteFunc(w.held, func(e modelEntry) bool { return slices.Contains(hashes, e.hash) })
			}
		case r < 63:
			err := x.Clear(name)
			require.Equal(t, known, err == nil, "op %d: Clear(%s)", op, name)
			if w, ok := model.workers[name]; ok {
				w.held = nil
			}
		case r < 67:
			x.RemoveWorker(name)
			delete(model.workers, name)
		case r < 75:
			c := []int{0, 1, 2, capacity / 4, capacity, 2 * capacity}[rng.IntN(6)]
			require.NoError(t, x.SetWorker(name, c), "op %d", op)
			model.setWorker(name, c)
		case r < 78:
			d := []time.Duration{0, time.Second, 5 * time.Second, time.Minute}[rng.IntN(4)]
			err := x.SetWorkerTTL(name, d)
			require.Equal(t, known, err == nil, "op %d: SetWorkerTTL(%s)", op, name)
			if w, ok := model.workers[name]; ok {
				w.ttl = d
			}
		default:
			clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
		if op%10 == 0 {
			requireIndexMatchesModel(t, x, model, clock.Now(), names, chainOf, op)
		}
	}
	requireIndexMatchesModel(t, x, model, clock.Now(), names, chainOf, -1)
}

func requireIndexMatchesModel(t *testing.T, x *Index, model *modelIndex, now time.Time, names []string, chainOf func() []uint64, op int) {
	t.Helper()
	model.expire(now)
	total := 0
	for _, w := range model.workers {
		total += len(w.held)
	}
	require.Equal(t, total, x.Entries(), "op %d: Entries", op)
	held, capacity := make([]int, len(names)), make([]int, len(names))
	x.Footprints(names, held, capacity)
	for i, name := range names {
		wantHeld, wantCapacity := 0, 0
		if w, ok := model.workers[name]; ok {
			wantHeld, wantCapacity = len(w.held), w.capacity
		}
		require.Equal(t, wantHeld, x.WorkerEntries(name), "op %d: WorkerEntries(%s)", op, name)
		require.Equal(t, []int{wantHeld, wantCapacity}, []int{held[i], capacity[i]}, "op %d: Footprints of %s", op, name)
	}
	for range 3 {
		query := chainOf()
		got := make([]int, len(names))
		x.Overlaps(query, names, got)
		for i, name := range names {
			require.Equal(t, model.overlap(name, query), got[i], "op %d: overlap of %s on %v", op, name, query)
		}
	}

	// The groups' tables hold exactly the bits of the workers holding each hash.
	x.mu.RLock()
	defer x.mu.RUnlock()
	want := make([]map[uint64]uint64, len(x.groups))
	for g := range want {
		want[g] = map[uint64]uint64{}
	}
	for name, mw := range model.workers {
		w := x.workers[name]
		require.NotNil(t, w, "op %d: worker %s", op, name)
		for _, e := range mw.held {
			want[w.slot/groupSize][e.hash] |= 1 << (w.slot % groupSize)
		}
	}
	for g, set := range x.groups {
		got := map[uint64]uint64{}
		set.each(func(h, v uint64) { got[h] = v })
		require.Equal(t, want[g], got, "op %d: group %d's table", op, g)
	}
}
