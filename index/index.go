package index

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// ErrUnknownWorker is returned when an operation names a worker the index was not told
// about with [Index.SetWorker].
var ErrUnknownWorker = errors.New("index: unknown worker")

// groupSize is the number of worker slots that share one hash → bitmask map: a lookup
// costs one map probe per block per group of 64 workers.
const groupSize = 64

// Index records which worker holds which chained block hash on device.
type Index struct {
	cfg Config
	now func() time.Time

	mu      sync.RWMutex
	workers map[string]*worker
	slots   []*worker     // slot → worker; nil where free
	groups  []*blockTable // group g: hash → bitmask of slots 64g..64g+63 holding it
	entries int           // (block, worker) pairs held, summed over workers

	// prefetched is where prefetch sums what it loads, so the loads are kept.
	prefetched uint64

	// nextExpiry is a lower bound (unix ns) on the time the oldest entry of any worker
	// expires, so lookups know without the write lock that nothing has expired yet.
	nextExpiry atomic.Int64
}

type worker struct {
	name string
	slot int
	held *lru
	ttl  time.Duration // 0: kept until capacity evicts
}

// New returns an empty index. now is the clock used for TTLs; nil means time.Now.
// cfg.PendingTTL is not read.
func New(cfg Config, now func() time.Time) (*Index, error) {
	if err := cfg.validateIndex(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	x := &Index{cfg: cfg, now: now, workers: make(map[string]*worker)}
	x.nextExpiry.Store(math.MaxInt64)
	return x, nil
}

// SetWorker adds a worker with the given capacity in blocks (0 means the config's
// default), or changes an existing worker's capacity, forgetting its oldest blocks if it
// now holds more.
func (x *Index) SetWorker(name string, capacityBlocks int) error {
	if capacityBlocks < 0 {
		return fmt.Errorf("index: worker %q: capacity_blocks must be ≥ 0, got %d", name, capacityBlocks)
	}
	if capacityBlocks == 0 {
		capacityBlocks = x.cfg.CapacityBlocks
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if w, ok := x.workers[name]; ok {
		w.held.maxSize = capacityBlocks
		for w.held.len() > capacityBlocks {
			x.unmark(w, w.held.popOldest())
		}
		return nil
	}
	slot := len(x.slots)
	for i, w := range x.slots {
		if w == nil {
			slot = i
			break
		}
	}
	if slot == len(x.slots) {
		x.slots = append(x.slots, nil)
		if slot/groupSize == len(x.groups) {
			x.groups = append(x.groups, newBlockTable(rand.Uint64(), shardBitsFor(groupSize*x.cfg.CapacityBlocks)))
		}
	}
	w := &worker{name: name, slot: slot, held: newLRU(capacityBlocks, rand.Uint64()), ttl: x.cfg.TTL}
	x.slots[slot] = w
	x.workers[name] = w
	return nil
}

// RemoveWorker forgets a worker and every block it held. Unknown names are ignored.
func (x *Index) RemoveWorker(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.workers[name]
	if !ok {
		return
	}
	x.clear(w)
	delete(x.workers, name)
	x.slots[w.slot] = nil
}

// SetWorkerTTL changes how long one worker's blocks are kept after they were last stored
// (0: until capacity evicts them); [Config.TTL] is every worker's default. An event-mode
// index keeps decisions for a short TTL on workers whose engines report events and for
// the long one on the others. Blocks already held older than a shortened TTL are
// forgotten at the next lookup.
func (x *Index) SetWorkerTTL(name string, ttl time.Duration) error {
	if ttl < 0 {
		return fmt.Errorf("index: worker %q: ttl must be ≥ 0, got %s", name, ttl)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.workers[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownWorker, name)
	}
	if ttl != w.ttl {
		w.ttl = ttl
		x.nextExpiry.Store(math.MinInt64) // recompute at the next expiry check
	}
	return nil
}

// Clear forgets every block a worker holds but keeps the worker, as after an engine's
// AllBlocksCleared or a restart.
func (x *Index) Clear(name string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.workers[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownWorker, name)
	}
	x.clear(w)
	return nil
}

// Store records that a worker holds the blocks with the given chained hashes, in prompt
// order, and marks them most recently used. Blocks past the worker's capacity are not
// stored: the leading ones are kept, since only a leading run counts as overlap. Older
// blocks are forgotten as capacity requires, deepest blocks of the oldest prompts first.
func (x *Index) Store(name string, hashes []uint64) error {
	_, err := x.storeEvicting(name, hashes, nil)
	return err
}

// storeEvicting is Store, appending to evicted the blocks the worker's capacity
// forgot to make room (not those its TTL expired), oldest first.
func (x *Index) storeEvicting(name string, hashes []uint64, evicted []uint64) ([]uint64, error) {
	now := x.now().UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expireLocked(now)
	w, ok := x.workers[name]
	if !ok {
		return evicted, fmt.Errorf("%w %q", ErrUnknownWorker, name)
	}
	hashes = hashes[:min(len(hashes), w.held.maxSize)]
	bit := uint64(1) << (w.slot % groupSize)
	set := x.groups[w.slot/groupSize]
	x.prefetch(w, set, hashes)
	// Touch the deepest block first so the first block ends most recent: the LRU then
	// evicts leaves before the prefixes they extend.
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if at, held := w.held.find(h); held {
			w.held.touch(at, now)
			continue
		}
		if w.held.len() >= w.held.maxSize {
			old := w.held.popOldest()
			x.unmark(w, old)
			evicted = append(evicted, old)
		}
		w.held.insert(h, now)
		*set.upsert(h) |= bit
		x.entries++
	}
	if w.ttl > 0 && len(hashes) > 0 {
		x.lowerNextExpiry(expiresAt(now, w.ttl))
	}
	return evicted, nil
}

// prefetch loads the table slots a Store of hashes on w is about to change: those of
// the deepest blocks w does not hold yet (what a resumed conversation adds after the
// prefix it holds), and those of the oldest entries their insertion will evict. These
// are rarely in cache, and loading them here, independently of each other, lets their
// cache and TLB misses overlap; Store's own loop then finds them in cache instead of
// missing on each in turn. It changes nothing, so what it leaves out costs only time.
func (x *Index) prefetch(w *worker, set *blockTable, hashes []uint64) {
	var sink uint64
	added := 0
	for i := len(hashes) - 1; i >= 0; i-- {
		if _, held := w.held.find(hashes[i]); held {
			break
		}
		sink += set.peek(hashes[i])
		added++
	}
	evicted := w.held.len() + added - w.held.maxSize
	for i := w.held.tail; evicted > 0 && i != none; evicted-- {
		victim := w.held.slab[i].hash
		sink += set.peek(victim) + w.held.pos.peek(victim)
		i = w.held.slab[i].prev
	}
	x.prefetched += sink
}

// TouchRun marks the leading run of hashes the worker holds most recently used,
// deepest first (so the first ends most recent), and adds nothing: an engine that
// looks a prompt's blocks up refreshes them in its own LRU without telling anyone.
func (x *Index) TouchRun(name string, hashes []uint64) {
	now := x.now().UnixNano()
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.workers[name]
	if !ok {
		return
	}
	var stack [64]int32
	at := stack[:0]
	for _, h := range hashes {
		i, held := w.held.find(h)
		if !held {
			break
		}
		at = append(at, i)
	}
	for k := len(at) - 1; k >= 0; k-- {
		w.held.touch(at[k], now)
	}
}

// Holds sets held[i] to whether the worker holds hashes[i] (false for an unknown
// worker), without making anything recently used. held must be as long as hashes.
func (x *Index) Holds(name string, hashes []uint64, held []bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	clear(held)
	w, ok := x.workers[name]
	if !ok {
		return
	}
	for i, h := range hashes {
		_, held[i] = w.held.find(h)
	}
}

// Remove forgets the given blocks of a worker, as after an engine's BlockRemoved. Blocks
// the worker does not hold are ignored.
func (x *Index) Remove(name string, hashes []uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	w, ok := x.workers[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownWorker, name)
	}
	for _, h := range hashes {
		if w.held.remove(h) {
			x.unmark(w, h)
		}
	}
	return nil
}

// Unrecord forgets blocks a decision recorded on a worker whose engine did not compute
// them (the data plane served the request elsewhere): in this index, Remove.
func (x *Index) Unrecord(name string, hashes []uint64) error { return x.Remove(name, hashes) }

// Overlaps writes to dst[i] the number of leading hashes that workers[i] holds: the walk
// stops at the first block the worker lacks. Unknown workers get 0. dst must be as long
// as workers.
func (x *Index) Overlaps(hashes []uint64, workers []string, dst []int) {
	x.expireDue()
	x.mu.RLock()
	defer x.mu.RUnlock()

	var slotBuf [64]int
	slots := slotBuf[:0]
	if len(workers) > len(slotBuf) {
		slots = make([]int, 0, len(workers))
	}
	var maskBuf [4]uint64
	masks := maskBuf[:0]
	if len(x.groups) > len(maskBuf) {
		masks = make([]uint64, 0, len(x.groups))
	}
	masks = masks[:len(x.groups)]
	clear(masks)
	for _, name := range workers {
		slot := -1
		if w, ok := x.workers[name]; ok {
			slot = w.slot
			masks[slot/groupSize] |= 1 << (slot % groupSize)
		}
		slots = append(slots, slot)
	}

	var ovs [groupSize]int
	for g, alive := range masks {
		if alive == 0 {
			continue
		}
		walk(x.groups[g], hashes, alive, &ovs)
		for i, slot := range slots {
			if slot >= 0 && slot/groupSize == g {
				dst[i] = ovs[slot%groupSize]
			}
		}
	}
	for i, slot := range slots {
		if slot < 0 {
			dst[i] = 0
		}
	}
}

// walk follows the chain through one group's bitmasks, writing each alive slot's overlap.
func walk(set *blockTable, hashes []uint64, alive uint64, ovs *[groupSize]int) {
	for i, h := range hashes {
		mask, _ := set.find(h)
		held := mask & alive
		for lost := alive &^ held; lost != 0; lost &= lost - 1 {
			ovs[bits.TrailingZeros64(lost)] = i
		}
		alive = held
		if alive == 0 {
			return
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		ovs[bits.TrailingZeros64(alive)] = len(hashes)
	}
}

// Entries returns the number of (block, worker) pairs held.
func (x *Index) Entries() int {
	x.expireDue()
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.entries
}

// WorkerEntries returns the number of blocks a worker holds, or 0 for an unknown worker.
func (x *Index) WorkerEntries(name string) int {
	x.expireDue()
	x.mu.RLock()
	defer x.mu.RUnlock()
	if w, ok := x.workers[name]; ok {
		return w.held.len()
	}
	return 0
}

// Footprints writes to held[i] and capacity[i] the blocks workers[i] holds and its
// capacity in blocks (0 and 0 for an unknown worker), under one lock: the router reads
// every candidate's footprint per decision. held and capacity must be as long as workers.
func (x *Index) Footprints(workers []string, held, capacity []int) {
	x.expireDue()
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, name := range workers {
		held[i], capacity[i] = 0, 0
		if w, ok := x.workers[name]; ok {
			held[i], capacity[i] = w.held.len(), w.held.maxSize
		}
	}
}

// expireDue runs an expiry pass if the oldest entry may have expired.
func (x *Index) expireDue() {
	if x.nextExpiry.Load() == math.MaxInt64 {
		return // nothing can expire: no clock read
	}
	now := x.now().UnixNano()
	if now < x.nextExpiry.Load() {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expireLocked(now)
}

// expireLocked forgets every entry not stored within the TTL. Entries leave each
// worker's LRU tail in age order, so a pass costs one check per worker plus one per
// expired entry.
func (x *Index) expireLocked(now int64) {
	if now < x.nextExpiry.Load() {
		return
	}
	next := int64(math.MaxInt64)
	for _, w := range x.workers {
		if w.ttl == 0 {
			continue
		}
		for {
			e, ok := w.held.oldest()
			if !ok {
				break
			}
			if at := expiresAt(e.touched, w.ttl); at > now {
				next = min(next, at)
				break
			}
			x.unmark(w, w.held.popOldest())
		}
	}
	x.nextExpiry.Store(next)
}

// expiresAt returns when (unix ns) an entry touched at touched expires under ttl > 0:
// at the end of time's int64 range when later, rather than wrapped to the past.
func expiresAt(touched int64, ttl time.Duration) int64 {
	if touched > math.MaxInt64-int64(ttl) {
		return math.MaxInt64
	}
	return touched + int64(ttl)
}

func (x *Index) lowerNextExpiry(at int64) {
	for {
		cur := x.nextExpiry.Load()
		if at >= cur || x.nextExpiry.CompareAndSwap(cur, at) {
			return
		}
	}
}

// unmark drops the worker's bit for a hash its LRU has just let go.
func (x *Index) unmark(w *worker, h uint64) {
	set := x.groups[w.slot/groupSize]
	mask, _ := set.find(h)
	if mask &^= 1 << (w.slot % groupSize); mask == 0 {
		set.delete(h)
	} else {
		*set.upsert(h) = mask
	}
	x.entries--
}

// clear forgets everything the worker holds and frees its table. A worker that holds
// nothing and has never held anything since its last clear is left as it is: an engine
// may send thousands of AllBlocksCleared in one batch, and a new table for each (its
// shards sized by the capacity: ~100 KB at a million blocks) made that gigabytes.
func (x *Index) clear(w *worker) {
	if w.held.pristine() {
		return
	}
	w.held.each(func(h uint64) { x.unmark(w, h) })
	w.held = newLRU(w.held.maxSize, rand.Uint64())
}
