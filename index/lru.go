package index

// lru is one worker's set of held blocks in least-recently-used order. Entries live in a
// slab addressed by int32, so a stored block costs no pointer and no allocation of its
// own (this is what keeps an index of millions of entries small and cheap to scan for
// the garbage collector). lru is not safe for concurrent use; Index guards it.
type lru struct {
	pos     *blockTable // block hash → slab index
	slab    []lruEntry
	head    int32 // most recently used, or none
	tail    int32 // least recently used, or none
	free    int32 // head of the free list threaded through next, or none
	maxSize int
}

type lruEntry struct {
	hash       uint64
	touched    int64 // unix nanoseconds of the last store
	prev, next int32
}

const none int32 = -1

// newLRU returns an empty lru whose position table mixes hashes with seed.
func newLRU(maxSize int, seed uint64) *lru {
	return &lru{pos: newBlockTable(seed, shardBitsFor(maxSize)), head: none, tail: none, free: none, maxSize: maxSize}
}

func (l *lru) len() int { return l.pos.len() }

// pristine reports whether the lru is as newLRU made it: no entry was ever inserted.
func (l *lru) pristine() bool { return len(l.slab) == 0 }

// find returns the slab index of hash.
func (l *lru) find(hash uint64) (int32, bool) {
	i, ok := l.pos.find(hash)
	return int32(i), ok
}

// touch marks the entry at slab index i (from pos) as most recently used at time now.
func (l *lru) touch(i int32, now int64) {
	l.slab[i].touched = now
	l.unlink(i)
	l.pushFront(i)
}

// insert adds hash, absent, as the most recently used entry at time now. The caller
// evicts first when the lru is full.
func (l *lru) insert(hash uint64, now int64) {
	i := l.free
	if i != none {
		l.free = l.slab[i].next
		l.slab[i] = lruEntry{hash: hash, touched: now}
	} else {
		i = int32(len(l.slab))
		l.slab = append(l.slab, lruEntry{hash: hash, touched: now})
	}
	*l.pos.upsert(hash) = uint64(i)
	l.pushFront(i)
}

// remove deletes hash and reports whether it was present.
func (l *lru) remove(hash uint64) bool {
	i, ok := l.find(hash)
	if !ok {
		return false
	}
	l.release(i)
	return true
}

// oldest returns the least recently used entry; ok is false when the lru is empty.
func (l *lru) oldest() (e lruEntry, ok bool) {
	if l.tail == none {
		return lruEntry{}, false
	}
	return l.slab[l.tail], true
}

// popOldest removes and returns the least recently used hash. The lru must not be empty.
func (l *lru) popOldest() uint64 {
	i := l.tail
	hash := l.slab[i].hash
	l.release(i)
	return hash
}

// each calls fn for every held hash, most recent first.
func (l *lru) each(fn func(hash uint64)) {
	for i := l.head; i != none; i = l.slab[i].next {
		fn(l.slab[i].hash)
	}
}

func (l *lru) release(i int32) {
	l.pos.delete(l.slab[i].hash)
	l.unlink(i)
	l.slab[i] = lruEntry{next: l.free, prev: none}
	l.free = i
}

func (l *lru) unlink(i int32) {
	e := &l.slab[i]
	if e.prev != none {
		l.slab[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next != none {
		l.slab[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = none, none
}

func (l *lru) pushFront(i int32) {
	e := &l.slab[i]
	e.prev, e.next = none, l.head
	if l.head != none {
		l.slab[l.head].prev = i
	}
	l.head = i
	if l.tail == none {
		l.tail = i
	}
}
