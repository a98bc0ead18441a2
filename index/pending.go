package index

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is where an [EventIndex] learns what one worker holds.
type Mode uint8

const (
	// ModeApproximate: the router's own decisions, kept for [Config.TTL] within the
	// worker's capacity (DESIGN §4 approximate mode). Workers without KV events, and
	// event workers whose stream has gone silent or broken, are in this mode.
	ModeApproximate Mode = iota
	// ModeEvents: what the engine reported in its KV events, plus each decision's blocks
	// for [Config.PendingTTL] until the engine reports them.
	ModeEvents
)

// String returns the mode's name in metrics and traces: "approximate" or "events".
func (m Mode) String() string {
	if m == ModeEvents {
		return "events"
	}
	return "approximate"
}

// EventIndex is the index of DESIGN §4 for a fleet that mixes workers whose engines
// report KV events with workers that do not. It holds two parts:
//   - confirmed: the blocks each engine reported (BlockStored, BlockRemoved,
//     AllBlocksCleared), bounded by the worker's capacity and never expiring: the
//     engine's events are the truth;
//   - recorded: the router's decisions. On an event-mode worker they are pending: only
//     the blocks past what the engine already reported count, until the engine confirms
//     or removes them, or [Config.PendingTTL] lapses (the request failed, or was served
//     from blocks the engine already had). Without them every decision made between a
//     routing decision and the engine's BlockStored would see the chosen worker as not
//     holding the prompt and not growing: a burst of new sessions would all land on the
//     same "emptiest" worker. On an approximate-mode worker they are the approximate
//     index itself, kept for [Config.TTL].
//
// A third part, offloaded, holds the blocks engines reported in a slower tier (host
// memory, kv_events.offload_tiers), bounded per worker by
// [Config.OffloadCapacity]; [EventIndex.Offloaded] reads the run of them that
// continues a worker's overlap.
//
// A worker's overlap walks its confirmed blocks, then continues through its recorded
// ones. The router reads it through Overlaps and Footprints and records its decisions
// with Store; the engines' event consumer calls BlockStored, BlockRemoved,
// AllBlocksCleared, Heard and SetMode.
type EventIndex struct {
	confirmed, recorded, offloaded *Index
	cfg                            Config
	now                            func() time.Time

	mu    sync.Mutex
	modes map[string]*workerMode
	// grains maps the workers whose offload tiers hold blocks in chunks of several of
	// kvroute's (SetOffloadGrain) to their chunks; copied on change, so Offloaded reads
	// it without the lock. Empty for every engine that offloads kvroute-sized blocks.
	grains atomic.Pointer[map[string]grain]
}

// grain is how a worker's engine holds and looks up its offloaded blocks.
type grain struct {
	blocks    int  // kvroute's blocks in one chunk (> 1 in grains)
	fromStart bool // looked up from the prompt's start (LMCache), else from the device hit's chunk (vLLM)
}

type workerMode struct {
	mode Mode
	// awaiting is when (unix ns) the router first sent the worker blocks it had not
	// reported since its last event; 0 when it owes none. An engine that owes events
	// for long is silent (see Awaiting).
	awaiting int64
}

// NewEventIndex returns an empty index. Every worker starts in approximate mode; now is
// the clock for TTLs (nil: time.Now).
func NewEventIndex(cfg Config, now func() time.Time) (*EventIndex, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	confirmed, err := New(Config{CapacityBlocks: cfg.CapacityBlocks}, now)
	if err != nil {
		return nil, err
	}
	recorded, err := New(Config{CapacityBlocks: cfg.CapacityBlocks, TTL: cfg.TTL}, now)
	if err != nil {
		return nil, err
	}
	offloaded, err := New(Config{CapacityBlocks: cfg.OffloadCapacity(cfg.CapacityBlocks)}, now)
	if err != nil {
		return nil, err
	}
	return &EventIndex{confirmed: confirmed, recorded: recorded, offloaded: offloaded, cfg: cfg, now: now, modes: map[string]*workerMode{}}, nil
}

// SetWorker adds a worker (in approximate mode) or changes its capacity in blocks (0:
// the config's default).
func (x *EventIndex) SetWorker(name string, capacityBlocks int) error {
	if err := x.confirmed.SetWorker(name, capacityBlocks); err != nil {
		return err
	}
	if err := x.recorded.SetWorker(name, capacityBlocks); err != nil {
		return err
	}
	if capacityBlocks == 0 {
		capacityBlocks = x.cfg.CapacityBlocks
	}
	if err := x.offloaded.SetWorker(name, x.cfg.OffloadCapacity(capacityBlocks)); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.modes[name]; !ok {
		x.modes[name] = &workerMode{}
	}
	return nil
}

// RemoveWorker forgets a worker and everything it held or was sent.
func (x *EventIndex) RemoveWorker(name string) {
	func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		delete(x.modes, name)
		x.setGrainLocked(name, 1, false)
	}()
	x.confirmed.RemoveWorker(name)
	x.recorded.RemoveWorker(name)
	x.offloaded.RemoveWorker(name)
}

// SetMode switches a worker between approximate and event mode. Entering approximate
// mode forgets the worker's confirmed and offloaded blocks (the events that would have told of their
// eviction are not arriving) and keeps decisions for [Config.TTL]; entering event mode
// keeps decisions for [Config.PendingTTL], so those recorded while approximate soon go.
func (x *EventIndex) SetMode(name string, mode Mode) error {
	changed, err := x.switchMode(name, mode)
	if err != nil || !changed {
		return err
	}
	if mode == ModeApproximate {
		func() {
			x.mu.Lock()
			defer x.mu.Unlock()
			x.setGrainLocked(name, 1, false) // guesses are blocks; the applier tells the grain again
		}()
		if err := x.confirmed.Clear(name); err != nil {
			return err
		}
		if err := x.offloaded.Clear(name); err != nil {
			return err
		}
		return x.recorded.SetWorkerTTL(name, x.cfg.TTL)
	}
	return x.recorded.SetWorkerTTL(name, x.cfg.PendingTTL)
}

// switchMode sets a worker's mode and reports whether it changed; entering event mode
// with [Config.ApproximateOffload] forgets what approximate mode guessed of its host
// memory, which the engine now reports.
func (x *EventIndex) switchMode(name string, mode Mode) (changed bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m, ok := x.modes[name]
	if !ok {
		return false, fmt.Errorf("%w %q", ErrUnknownWorker, name)
	}
	changed = m.mode != mode
	m.mode, m.awaiting = mode, 0
	if changed && mode == ModeEvents && x.cfg.ApproximateOffload {
		if err := x.offloaded.Clear(name); err != nil {
			return false, err
		}
	}
	return changed, nil
}

// Mode returns a worker's mode (approximate for an unknown worker).
func (x *EventIndex) Mode(name string) Mode {
	x.mu.Lock()
	defer x.mu.Unlock()
	if m, ok := x.modes[name]; ok {
		return m.mode
	}
	return ModeApproximate
}

// Heard records that a worker's engine just reported events: it owes none.
func (x *EventIndex) Heard(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if m, ok := x.modes[name]; ok {
		m.awaiting = 0
	}
}

// Awaiting reports since when an event-mode worker has owed events: the first decision
// since its last event that sent it blocks it had not reported. ok is false when it owes
// none (an idle engine is not silent).
func (x *EventIndex) Awaiting(name string) (since time.Time, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m, found := x.modes[name]
	if !found || m.awaiting == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, m.awaiting), true
}

// Store records a routing decision: the worker is about to hold these blocks. Only the
// blocks past the leading run the worker already reported are recorded, so the two
// parts rarely share a block and a worker's footprint is taken as their sum. They can:
// a reported block after a gap in that run (a middle block removed) is recorded too,
// because the overlap walk needs the run unbroken, and the footprint counts it twice
// until its recording lapses (pending_ttl).
//
// With [Config.ApproximateOffload], the blocks an approximate worker's capacity evicts
// to make room are kept as offloaded: its engine wrote them through to host memory.
func (x *EventIndex) Store(name string, hashes []uint64) error {
	if x.offloaded.Entries() > 0 {
		// The engine looks the prompt up in its host memory too, which keeps what it
		// finds there in its LRU: so must the index, or it would evict the hottest
		// prefixes first (engines report stores and removals, not uses).
		x.offloaded.TouchRun(name, hashes)
	}
	var held [1]int
	x.confirmed.Overlaps(hashes, []string{name}, held[:])
	pending := hashes[held[0]:]
	if x.cfg.ApproximateOffload && x.Mode(name) == ModeApproximate {
		var stack [64]uint64
		evicted, err := x.recorded.storeEvicting(name, pending, stack[:0])
		if err != nil || len(evicted) == 0 {
			return err
		}
		slices.Reverse(evicted) // popped deepest first: chain order keeps the prefixes recent
		x.mu.Lock()             // against SetMode(events) clearing the guesses in between
		defer x.mu.Unlock()
		if m, ok := x.modes[name]; !ok || m.mode != ModeApproximate {
			return nil
		}
		return x.offloaded.Store(name, evicted)
	}
	if err := x.recorded.Store(name, pending); err != nil {
		return err
	}
	if len(pending) > 0 {
		x.owe(name)
	}
	return nil
}

// owe records that an event-mode worker owes events from now on, unless it already
// did (Awaiting).
func (x *EventIndex) owe(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if m, ok := x.modes[name]; ok && m.mode == ModeEvents && m.awaiting == 0 {
		m.awaiting = x.now().UnixNano()
	}
}

// Unrecord forgets blocks a decision recorded on a worker whose engine did not compute
// them (the data plane served the request elsewhere). Only the recorded part loses them:
// what the engine reported stays. Its engine will never report them either: a worker
// left with no recorded block owes no event (Awaiting), so the silence watchdog does
// not take its working stream for silent. One still holding another decision's blocks
// owes them since the first decision after its last event, as before.
func (x *EventIndex) Unrecord(name string, hashes []uint64) error {
	if err := x.recorded.Remove(name, hashes); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	// Under x.mu: a Store that records after this check sets awaiting after it, and one
	// that recorded before it leaves an entry that keeps awaiting.
	if m, ok := x.modes[name]; ok && m.awaiting != 0 && x.recorded.WorkerEntries(name) == 0 {
		m.awaiting = 0
	}
	return nil
}

// BlockStored applies an engine's BlockStored event (hashes in chain order, as the
// router computes them): the blocks are confirmed and no longer pending.
func (x *EventIndex) BlockStored(name string, hashes []uint64) error {
	if err := x.confirmed.Store(name, hashes); err != nil {
		return err
	}
	return x.recorded.Remove(name, hashes)
}

// BlockRemoved applies an engine's BlockRemoved event.
func (x *EventIndex) BlockRemoved(name string, hashes []uint64) error {
	if err := x.confirmed.Remove(name, hashes); err != nil {
		return err
	}
	return x.recorded.Remove(name, hashes)
}

// OffloadStored applies a BlockStored event of an offload tier: the worker holds the
// blocks (hashes in chain order) in host memory. They do not count as held on device.
func (x *EventIndex) OffloadStored(name string, hashes []uint64) error {
	return x.offloaded.Store(name, hashes)
}

// OffloadRemoved applies a BlockRemoved event of an offload tier.
func (x *EventIndex) OffloadRemoved(name string, hashes []uint64) error {
	return x.offloaded.Remove(name, hashes)
}

// AllBlocksCleared applies an engine's AllBlocksCleared event (or a restart or an event
// gap): the worker holds nothing the index can vouch for, in any tier.
func (x *EventIndex) AllBlocksCleared(name string) error {
	if err := x.confirmed.Clear(name); err != nil {
		return err
	}
	if err := x.offloaded.Clear(name); err != nil {
		return err
	}
	return x.recorded.Clear(name)
}

// Clear is AllBlocksCleared: a worker that went down may come back with an empty cache.
func (x *EventIndex) Clear(name string) error { return x.AllBlocksCleared(name) }

// Overlaps writes to dst[i] the leading blocks workers[i] holds, confirmed or recorded:
// the walk runs through the confirmed blocks and continues through the recorded ones.
// dst must be as long as workers.
func (x *EventIndex) Overlaps(hashes []uint64, workers []string, dst []int) {
	if x.confirmed.Entries() == 0 {
		// No engine reported anything (a fleet without KV events): one walk.
		x.recorded.Overlaps(hashes, workers, dst)
		return
	}
	x.confirmed.Overlaps(hashes, workers, dst)
	// Continue each worker's walk in the recorded blocks from where its confirmed walk
	// stopped.
	var stack [64]int
	more := ints(&stack, len(workers))
	walkFrom(x.recorded, hashes, workers, dst, more)
	for i, n := range more {
		dst[i] += n
	}
}

// ints returns n ints, on the caller's stack array when they fit (fleets of up to 64
// workers decide without allocating).
func ints(stack *[64]int, n int) []int {
	if n > len(stack) {
		return make([]int, n)
	}
	return stack[:n]
}

// walkFrom writes to runs[i] the leading blocks of hashes[from[i]:] that workers[i]
// holds in part (0 when from[i] is not within hashes). Workers that start at the same
// block share one lookup. from and runs must be as long as workers, and may be one
// slice.
func walkFrom(part *Index, hashes []uint64, workers []string, from, runs []int) {
	n := len(workers)
	var stack [3 * 64]int
	buf := stack[:]
	var names [64]string
	sub := names[:0]
	if n > len(names) {
		buf, sub = make([]int, 3*n), make([]string, 0, n)
	}
	starts, idx, found := buf[:n], buf[n:2*n], buf[2*n:3*n]
	copy(starts, from)
	clear(runs[:n])
	for i, start := range starts {
		if start < 0 || start >= len(hashes) {
			continue
		}
		sub, idx = sub[:0], idx[:0]
		for j := i; j < n; j++ {
			if starts[j] == start {
				sub, idx = append(sub, workers[j]), append(idx, j)
				starts[j] = -1 // walked
			}
		}
		part.Overlaps(hashes[start:], sub, found[:len(sub)])
		for k, j := range idx {
			runs[j] = found[k]
		}
	}
}

// Offloaded writes to dst[i] the run of blocks, starting at hashes[from[i]], that
// workers[i] holds in an offload tier: the blocks its engine would load from host
// memory after its device overlap from[i] (as [EventIndex.Overlaps] gives it); for a
// worker whose host holds chunks ([EventIndex.SetOffloadGrain]), whole chunks walked
// from the prompt's start or from the chunk holding from[i], up to a chunk's end.
// dst and from must be as long as workers.
func (x *EventIndex) Offloaded(hashes []uint64, workers []string, from, dst []int) {
	if x.offloaded.Entries() == 0 {
		// No engine reports an offload tier: nothing to walk.
		clear(dst[:len(workers)])
		return
	}
	grains := x.grains.Load()
	if grains == nil || len(*grains) == 0 {
		walkFrom(x.offloaded, hashes, workers, from, dst)
		return
	}
	// An engine whose host holds chunks loads whole ones. LMCache looks them up from
	// the prompt's start: its run is walked from block 0, so whatever its device holds,
	// a chunk missing from the host ends what it loads. vLLM's OffloadingConnector
	// looks them up from the chunk holding the end of its device hit. Either run is cut
	// to a chunk's end and counts past the device overlap.
	var stack [64]int
	start := ints(&stack, len(workers))
	for i, w := range workers {
		switch g := (*grains)[w]; {
		case g.blocks <= 1:
			start[i] = from[i]
		case g.fromStart:
			start[i] = 0
		default:
			start[i] = from[i] / g.blocks * g.blocks
		}
	}
	walkFrom(x.offloaded, hashes, workers, start, dst)
	for i, w := range workers {
		if g := (*grains)[w]; g.blocks > 1 {
			dst[i] = max(start[i]+dst[i]/g.blocks*g.blocks-from[i], 0)
			if !g.fromStart && dst[i] < g.blocks {
				// vLLM loads nothing when what it would load is less than one offloaded
				// block (get_num_new_matched_tokens).
				dst[i] = 0
			}
		}
	}
}

// SetOffloadGrain says that a worker's offload tiers hold blocks in chunks of blocks of
// kvroute's, counted from the prompt's start, and that its engine loads whole chunks,
// so Offloaded ends the worker's runs at a chunk's end. fromStart says where the
// engine's lookup begins: at the prompt's first chunk (LMCache's chunks, 256 tokens by
// default, are 16 of 16-token blocks), or else at the chunk holding the end of its
// device hit (vLLM's OffloadingConnector with an offloaded block size k times the
// GPU's). 1 (the default) is kvroute's own block, walked from the device overlap.
func (x *EventIndex) SetOffloadGrain(name string, blocks int, fromStart bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.modes[name]; !ok {
		return // unknown: a grain kept for it would apply to a worker added later by that name
	}
	x.setGrainLocked(name, blocks, fromStart)
}

// OffloadGrain returns the chunk size, in blocks, of the worker's offload tiers (1:
// kvroute's blocks), as SetOffloadGrain last set it.
func (x *EventIndex) OffloadGrain(name string) int {
	if p := x.grains.Load(); p != nil {
		return max((*p)[name].blocks, 1)
	}
	return 1
}

func (x *EventIndex) setGrainLocked(name string, blocks int, fromStart bool) {
	g := grain{blocks: blocks, fromStart: fromStart}
	if blocks <= 1 {
		g = grain{}
	}
	var grains map[string]grain
	if p := x.grains.Load(); p != nil {
		grains = *p
	}
	if grains[name] == g {
		return
	}
	next := map[string]grain{}
	maps.Copy(next, grains)
	if g.blocks == 0 {
		delete(next, name)
	} else {
		next[name] = g
	}
	x.grains.Store(&next)
}

// OffloadedHeld sets held[i] to whether the worker's offloaded blocks include
// hashes[i]. held must be as long as hashes.
func (x *EventIndex) OffloadedHeld(name string, hashes []uint64, held []bool) {
	x.offloaded.Holds(name, hashes, held)
}

// OffloadedEntries returns the blocks a worker's engine reported in its offload tiers
// and the index holds.
func (x *EventIndex) OffloadedEntries(name string) int {
	return x.offloaded.WorkerEntries(name)
}

// Footprints writes each worker's confirmed plus recorded blocks and its capacity.
func (x *EventIndex) Footprints(workers []string, held, capacity []int) {
	x.confirmed.Footprints(workers, held, capacity)
	extra := make([]int, 2*len(workers))
	x.recorded.Footprints(workers, extra[:len(workers)], extra[len(workers):])
	for i := range held {
		held[i] += extra[i]
	}
}

// Entries returns the confirmed and recorded (block, worker) pairs held.
func (x *EventIndex) Entries() (confirmed, recorded int) {
	return x.confirmed.Entries(), x.recorded.Entries()
}

// WorkerEntries returns the blocks a worker holds, confirmed or recorded.
func (x *EventIndex) WorkerEntries(name string) int {
	return x.confirmed.WorkerEntries(name) + x.recorded.WorkerEntries(name)
}

// ConfirmedEntries returns the blocks a worker's engine reported and the index holds.
func (x *EventIndex) ConfirmedEntries(name string) int {
	return x.confirmed.WorkerEntries(name)
}

// ConfirmedOverlaps is Overlaps over the engines' reported blocks only, without the
// router's decisions: what several kvroute replicas subscribed to the same engines agree
// on whatever each of them routed.
func (x *EventIndex) ConfirmedOverlaps(hashes []uint64, workers []string, dst []int) {
	x.confirmed.Overlaps(hashes, workers, dst)
}
