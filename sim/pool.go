package sim

import (
	"container/heap"
	"time"
)

// block is one KV block of the pool.
type block struct {
	hash    uint64 // chained hash; meaningful when cached
	cached  bool   // stored in the prefix cache (a full block, computed)
	ref     int    // running requests using it
	depth   int    // position in its sequence: deeper blocks are evicted first on ties
	used    time.Duration
	version int // bumped on every push to the evictable heap, to skip stale entries
}

// pool tracks the engine's blocks: free ones, cached ones and the inactive cached ones
// that may be evicted.
type pool struct {
	total     int
	free      int               // never used, or released uncached blocks
	cache     map[uint64]*block // hash → cached block (active or not)
	evictable evictHeap         // cached blocks with ref 0 (lazily cleaned)
	idle      int               // cached blocks with ref 0
}

func newPool(total int) *pool {
	return &pool{total: total, free: total, cache: make(map[uint64]*block)}
}

// available is how many blocks an allocation could get now.
func (p *pool) available() int { return p.free + p.idle }

// inUse is the number of blocks held by running requests.
func (p *pool) inUse() int { return p.total - p.available() }

// take references a cached block for a request.
func (p *pool) take(b *block) {
	if b.ref == 0 {
		p.idle--
	}
	b.ref++
}

// alloc returns a new uncached block, evicting the least recently used inactive cached
// block if no free one is left; evicted hashes are appended to removed. ok is false
// when neither exists.
func (p *pool) alloc(depth int, removed *[]uint64) (*block, bool) {
	if p.free > 0 {
		p.free--
		return &block{ref: 1, depth: depth}, true
	}
	for p.evictable.Len() > 0 {
		e := heap.Pop(&p.evictable).(evictEntry)
		b := e.b
		if e.version != b.version || b.ref > 0 || !b.cached {
			continue // stale: reused since it was pushed
		}
		delete(p.cache, b.hash)
		p.idle--
		*removed = append(*removed, b.hash)
		return &block{ref: 1, depth: depth}, true
	}
	return nil, false
}

// release drops a request's reference. An inactive cached block becomes evictable, used
// at now; an uncached one goes back to the free list.
func (p *pool) release(b *block, now time.Duration) {
	b.ref--
	if b.ref > 0 {
		return
	}
	if !b.cached {
		p.free++
		return
	}
	b.used = now
	b.version++
	p.idle++
	heap.Push(&p.evictable, evictEntry{b: b, used: now, depth: b.depth, version: b.version})
}

// store caches a computed full block under hash. It reports false when the hash is
// already cached (another request computed the same block): the block stays a private
// duplicate, freed when released, as in vLLM.
func (p *pool) store(b *block, hash uint64) bool {
	if _, dup := p.cache[hash]; dup {
		return false
	}
	b.hash, b.cached = hash, true
	p.cache[hash] = b
	return true
}

type evictEntry struct {
	b       *block
	used    time.Duration
	depth   int
	version int
}

// evictHeap orders inactive blocks: least recently used first, deeper first on ties
// (a sequence's blocks are released together, so its leaves go before its prefix).
type evictHeap []evictEntry

func (h evictHeap) Len() int { return len(h) }
func (h evictHeap) Less(i, j int) bool {
	if h[i].used != h[j].used {
		return h[i].used < h[j].used
	}
	return h[i].depth > h[j].depth
}
func (h evictHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *evictHeap) Push(x any)   { *h = append(*h, x.(evictEntry)) }
func (h *evictHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
