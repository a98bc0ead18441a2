package sim

import "container/list"

// hostTier is the host (CPU) copy of the device's blocks, as vLLM's OffloadingConnector
// or LMCache keeps it: a least recently used set of block hashes. Host copies are
// never in use by a request (a load copies them to device blocks), so unlike the
// device pool it needs no reference counts and may evict any entry. A zero capacity
// holds nothing.
type hostTier struct {
	capacity int
	lru      list.List // hashes, most recently used at the front
	entries  map[uint64]*list.Element
}

func newHostTier(capacity int) *hostTier {
	return &hostTier{capacity: capacity, entries: make(map[uint64]*list.Element)}
}

// has reports whether the tier holds hash, without making it recently used.
func (h *hostTier) has(hash uint64) bool {
	_, ok := h.entries[hash]
	return ok
}

// touch makes hash, if held, the most recently used, and reports whether it is held.
func (h *hostTier) touch(hash uint64) bool {
	el, ok := h.entries[hash]
	if ok {
		h.lru.MoveToFront(el)
	}
	return ok
}

// put writes hash through to the tier and reports whether it was newly stored; a
// hash already held is touched instead. A full tier first evicts its least recently
// used hash, appended to evicted.
func (h *hostTier) put(hash uint64, evicted *[]uint64) bool {
	if h.capacity == 0 {
		return false
	}
	if h.touch(hash) {
		return false
	}
	if h.lru.Len() >= h.capacity {
		old := h.lru.Remove(h.lru.Back()).(uint64)
		delete(h.entries, old)
		*evicted = append(*evicted, old)
	}
	h.entries[hash] = h.lru.PushFront(hash)
	return true
}

// len is the number of hashes held.
func (h *hostTier) len() int { return h.lru.Len() }
