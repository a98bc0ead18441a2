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

// modelEvents is the reference an EventIndex is held to: three modelIndex parts
// (confirmed without a TTL, recorded with a TTL by mode, offloaded without one) and,
// per worker, its mode, the time it first owed events and its offload grain.
type modelEvents struct {
	cfg                            Config
	confirmed, recorded, offloaded *modelIndex
	workers                        map[string]*modelEventWorker
	grains                         map[string]modelGrain
}

type modelEventWorker struct {
	mode     Mode
	awaiting time.Time // zero: owes none
}

// modelGrain is a worker's offload grain; SetOffloadGrain sets it for known workers only.
type modelGrain struct {
	blocks    int
	fromStart bool
}

func newModelEvents(cfg Config) *modelEvents {
	return &modelEvents{
		cfg:       cfg,
		confirmed: &modelIndex{defaultCapacity: cfg.CapacityBlocks, workers: map[string]*modelWorker{}},
		recorded:  &modelIndex{defaultCapacity: cfg.CapacityBlocks, defaultTTL: cfg.TTL, workers: map[string]*modelWorker{}},
		offloaded: &modelIndex{defaultCapacity: cfg.OffloadCapacity(cfg.CapacityBlocks), workers: map[string]*modelWorker{}},
		workers:   map[string]*modelEventWorker{},
		grains:    map[string]modelGrain{},
	}
}

func (m *modelIndex) remove(name string, hashes []uint64) {
	if w, ok := m.workers[name]; ok {
		w.held = slices.DeleteFunc(w.held, func(e modelEntry) bool { return slices.Contains(hashes, e.hash) })
	}
}

func (m *modelIndex) clear(name string) {
	if w, ok := m.workers[name]; ok {
		w.held = nil
	}
}

func (m *modelIndex) entries() int {
	n := 0
	for _, w := range m.workers {
		n += len(w.held)
	}
	return n
}

func (m *modelIndex) workerEntries(name string) int {
	if w, ok := m.workers[name]; ok {
		return len(w.held)
	}
	return 0
}

// storeEvicting is store, returning the blocks the capacity evicted, oldest first.
func (m *modelIndex) storeEvicting(name string, hashes []uint64, now time.Time) (evicted []uint64, ok bool) {
	m.expire(now)
	w, ok := m.workers[name]
	if !ok {
		return nil, false
	}
	hashes = hashes[:min(len(hashes), w.capacity)]
	for i := len(hashes) - 1; i >= 0; i-- {
		if at := m.find(w, hashes[i]); at >= 0 {
			w.held = slices.Delete(w.held, at, at+1)
		} else if len(w.held) >= w.capacity {
			evicted = append(evicted, w.held[0].hash)
			w.held = slices.Delete(w.held, 0, 1)
		}
		w.held = append(w.held, modelEntry{hash: hashes[i], touched: now})
	}
	return evicted, true
}

// touchRun makes the leading run the worker holds most recent, the first block last.
func (m *modelIndex) touchRun(name string, hashes []uint64, now time.Time) {
	w, ok := m.workers[name]
	if !ok {
		return
	}
	n := m.overlap(name, hashes)
	for i := n - 1; i >= 0; i-- {
		at := m.find(w, hashes[i])
		w.held = append(slices.Delete(w.held, at, at+1), modelEntry{hash: hashes[i], touched: now})
	}
}

func (m *modelEvents) setWorker(name string, capacity int) {
	m.confirmed.setWorker(name, capacity)
	m.recorded.setWorker(name, capacity)
	if capacity == 0 {
		capacity = m.cfg.CapacityBlocks
	}
	m.offloaded.setWorker(name, m.cfg.OffloadCapacity(capacity))
	if _, ok := m.workers[name]; !ok {
		m.workers[name] = &modelEventWorker{}
	}
}

func (m *modelEvents) removeWorker(name string) {
	delete(m.workers, name)
	delete(m.grains, name)
	delete(m.confirmed.workers, name)
	delete(m.recorded.workers, name)
	delete(m.offloaded.workers, name)
}

func (m *modelEvents) setMode(name string, mode Mode) bool {
	w, ok := m.workers[name]
	if !ok {
		return false
	}
	changed := w.mode != mode
	w.mode, w.awaiting = mode, time.Time{}
	if !changed {
		return true
	}
	if mode == ModeEvents {
		if m.cfg.ApproximateOffload {
			m.offloaded.clear(name)
		}
		m.recorded.workers[name].ttl = m.cfg.PendingTTL
		return true
	}
	delete(m.grains, name)
	m.confirmed.clear(name)
	m.offloaded.clear(name)
	m.recorded.workers[name].ttl = m.cfg.TTL
	return true
}

func (m *modelEvents) store(name string, hashes []uint64, now time.Time) bool {
	if m.offloaded.entries() > 0 {
		m.offloaded.touchRun(name, hashes, now)
	}
	pending := hashes[m.confirmed.overlap(name, hashes):]
	w, known := m.workers[name]
	if m.cfg.ApproximateOffload && known && w.mode == ModeApproximate {
		evicted, ok := m.recorded.storeEvicting(name, pending, now)
		slices.Reverse(evicted)
		if ok && len(evicted) > 0 {
			m.offloaded.store(name, evicted, now)
		}
		return ok
	}
	if !m.recorded.store(name, pending, now) {
		return false
	}
	if len(pending) > 0 && w.mode == ModeEvents && w.awaiting.IsZero() {
		w.awaiting = now
	}
	return true
}

// deviceOverlap is the confirmed run, continued in the recorded blocks.
func (m *modelEvents) deviceOverlap(name string, hashes []uint64) int {
	n := m.confirmed.overlap(name, hashes)
	return n + m.recorded.overlap(name, hashes[n:])
}

// offloadedRun is what Offloaded promises for one worker from its device overlap.
func (m *modelEvents) offloadedRun(name string, hashes []uint64, from int) int {
	w, ok := m.grains[name]
	if !ok || w.blocks <= 1 {
		return m.offloaded.overlap(name, hashes[from:])
	}
	g := w.blocks
	start := from / g * g
	if w.fromStart {
		start = 0
	}
	n := 0
	if start < len(hashes) {
		n = m.offloaded.overlap(name, hashes[start:])
	}
	run := max(start+n/g*g-from, 0)
	if !w.fromStart && run < g {
		run = 0
	}
	return run
}

// TestEventIndexAgreesWithAReferenceModel runs seeded random sequences of every
// EventIndex operation (workers added, resized and removed past one group of 64 slots,
// mode switches, decisions, the engines' device and offload events, clears, grains and
// clock steps) against a model built of plain lists, and compares every answer:
// overlaps, offloaded runs, footprints, entries of each part, modes and awaited events.
func TestEventIndexAgreesWithAReferenceModel(t *testing.T) {
	for _, cfg := range []Config{
		{CapacityBlocks: 24, TTL: 20 * time.Second, PendingTTL: 2 * time.Second},
		{CapacityBlocks: 24, TTL: 20 * time.Second, PendingTTL: 2 * time.Second, ApproximateOffload: true, OffloadCapacityBlocks: 40},
		{CapacityBlocks: 60, PendingTTL: time.Second, ApproximateOffload: true},
	} {
		for seed := range uint64(2) {
			t.Run(fmt.Sprintf("capacity=%d/offload=%v/seed=%d", cfg.CapacityBlocks, cfg.ApproximateOffload, seed), func(t *testing.T) {
				runEventIndexModel(t, cfg, seed)
			})
		}
	}
}

func runEventIndexModel(t *testing.T, cfg Config, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(cfg.CapacityBlocks)))
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	x, err := NewEventIndex(cfg, clock.Now)
	require.NoError(t, err)
	model := newModelEvents(cfg)

	names := make([]string, 70)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	prompts := make([][]uint64, 10)
	for i := range prompts {
		prompts[i] = make([]uint64, 1+rng.IntN(2*cfg.CapacityBlocks))
		for j := range prompts[i] {
			prompts[i][j] = rng.Uint64N(400)
		}
	}
	chainOf := func() []uint64 {
		p := prompts[rng.IntN(len(prompts))]
		c := slices.Clone(p[:rng.IntN(len(p)+1)])
		for n := rng.IntN(3); n > 0; n-- {
			c = append(c, rng.Uint64N(400))
		}
		return c
	}
	// A slice of a chain, as one event reports it.
	partOf := func() []uint64 {
		c := chainOf()
		from := rng.IntN(len(c) + 1)
		return c[from:]
	}
	for _, name := range names[:50] {
		require.NoError(t, x.SetWorker(name, 0))
		model.setWorker(name, 0)
	}

	for op := range 2500 {
		name := names[rng.IntN(len(names))]
		_, known := model.workers[name]
		switch r := rng.IntN(100); {
		case r < 30:
			hashes := chainOf()
			err := x.Store(name, hashes)
			require.Equal(t, model.store(name, hashes, clock.Now()), err == nil, "op %d: Store(%s): %v", op, name, err)
		case r < 45:
			hashes := partOf()
			err := x.BlockStored(name, hashes)
			require.Equal(t, known, err == nil, "op %d: BlockStored(%s)", op, name)
			if known {
				model.confirmed.store(name, hashes, clock.Now())
				model.recorded.remove(name, hashes)
			}
		case r < 52:
			hashes := partOf()
			err := x.BlockRemoved(name, hashes)
			require.Equal(t, known, err == nil, "op %d: BlockRemoved(%s)", op, name)
			model.confirmed.remove(name, hashes)
			model.recorded.remove(name, hashes)
		case r < 60:
			hashes := partOf()
			err := x.OffloadStored(name, hashes)
			require.Equal(t, known, err == nil, "op %d: OffloadStored(%s)", op, name)
			model.offloaded.store(name, hashes, clock.Now())
		case r < 63:
			hashes := partOf()
			err := x.OffloadRemoved(name, hashes)
			require.Equal(t, known, err == nil, "op %d: OffloadRemoved(%s)", op, name)
			model.offloaded.remove(name, hashes)
		case r < 65:
			err := x.AllBlocksCleared(name)
			require.Equal(t, known, err == nil, "op %d: AllBlocksCleared(%s)", op, name)
			model.confirmed.clear(name)
			model.recorded.clear(name)
			model.offloaded.clear(name)
		case r < 73:
			mode := Mode(rng.IntN(2))
			err := x.SetMode(name, mode)
			require.Equal(t, model.setMode(name, mode), err == nil, "op %d: SetMode(%s, %s): %v", op, name, mode, err)
		case r < 76:
			x.Heard(name)
			if w, ok := model.workers[name]; ok {
				w.awaiting = time.Time{}
			}
		case r < 79:
			grain, fromStart := []int{1, 2, 4}[rng.IntN(3)], rng.IntN(2) == 0
			x.SetOffloadGrain(name, grain, fromStart)
			_, known := model.workers[name]
			switch {
			case !known: // not kept for a worker added later by that name
			case grain <= 1:
				delete(model.grains, name)
			default:
				model.grains[name] = modelGrain{blocks: grain, fromStart: fromStart}
			}
		case r < 82:
			x.RemoveWorker(name)
			model.removeWorker(name)
		case r < 86:
			c := []int{0, 1, 3, cfg.CapacityBlocks / 2, 2 * cfg.CapacityBlocks}[rng.IntN(5)]
			require.NoError(t, x.SetWorker(name, c), "op %d", op)
			model.setWorker(name, c)
		default:
			clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		if op%20 == 0 {
			requireEventIndexMatchesModel(t, x, model, clock.Now(), names, chainOf, op)
		}
	}
	requireEventIndexMatchesModel(t, x, model, clock.Now(), names, chainOf, -1)
	for _, name := range names {
		x.RemoveWorker(name)
	}
	confirmed, recorded := x.Entries()
	require.Equal(t, [3]int{0, 0, 0}, [3]int{confirmed, recorded, x.offloaded.Entries()}, "nothing outlives its workers")
	require.Empty(t, x.modes)
	if p := x.grains.Load(); p != nil {
		require.Empty(t, *p)
	}
}

func requireEventIndexMatchesModel(t *testing.T, x *EventIndex, m *modelEvents, now time.Time, names []string, chainOf func() []uint64, op int) {
	t.Helper()
	m.recorded.expire(now)
	confirmed, recorded := x.Entries()
	require.Equal(t, [3]int{m.confirmed.entries(), m.recorded.entries(), m.offloaded.entries()},
		[3]int{confirmed, recorded, x.offloaded.Entries()}, "op %d: entries (confirmed, recorded, offloaded)", op)
	held, capacity := make([]int, len(names)), make([]int, len(names))
	x.Footprints(names, held, capacity)
	for i, name := range names {
		wantHeld, wantCapacity := m.confirmed.workerEntries(name)+m.recorded.workerEntries(name), 0
		if w, ok := m.confirmed.workers[name]; ok {
			wantCapacity = w.capacity
		}
		require.Equal(t, [2]int{wantHeld, wantCapacity}, [2]int{held[i], capacity[i]}, "op %d: footprint of %s", op, name)
		require.Equal(t, wantHeld, x.WorkerEntries(name), "op %d: WorkerEntries(%s)", op, name)
		require.Equal(t, m.confirmed.workerEntries(name), x.ConfirmedEntries(name), "op %d: ConfirmedEntries(%s)", op, name)
		require.Equal(t, m.offloaded.workerEntries(name), x.OffloadedEntries(name), "op %d: OffloadedEntries(%s)", op, name)
		wantMode, wantSince := ModeApproximate, time.Time{}
		if w, ok := m.workers[name]; ok {
			wantMode, wantSince = w.mode, w.awaiting
		}
		require.Equal(t, wantMode, x.Mode(name), "op %d: Mode(%s)", op, name)
		since, owed := x.Awaiting(name)
		require.Equal(t, !wantSince.IsZero(), owed, "op %d: Awaiting(%s)", op, name)
		if owed {
			require.True(t, wantSince.Equal(since), "op %d: Awaiting(%s) since %s, want %s", op, name, since, wantSince)
		}
	}
	for range 3 {
		query := chainOf()
		device := make([]int, len(names))
		x.Overlaps(query, names, device)
		confirmedOnly := make([]int, len(names))
		x.ConfirmedOverlaps(query, names, confirmedOnly)
		offloaded := make([]int, len(names))
		x.Offloaded(query, names, device, offloaded)
		for i, name := range names {
			require.Equal(t, m.deviceOverlap(name, query), device[i], "op %d: overlap of %s on %v", op, name, query)
			require.Equal(t, m.confirmed.overlap(name, query), confirmedOnly[i], "op %d: confirmed overlap of %s", op, name)
			require.Equal(t, m.offloadedRun(name, query, device[i]), offloaded[i], "op %d: offloaded run of %s on %v from %d", op, name, query, device[i])
		}
	}
}
