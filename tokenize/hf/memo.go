package hf

import (
	"hash/maphash"
	"math"
	"sync"
	"unsafe"
)

// memoEntryOverhead approximates the bytes an entry costs beyond its text and ids: its
// index slot, its slab entry and its allocation's rounding.
const memoEntryOverhead = 128

// memo maps a piece of normalized text to its ids, least recently used evicted first,
// bounded by the bytes it holds. One mutex guards it: a lookup is a hash, a map probe,
// a comparison and two index moves, short next to encoding a piece.
//
// It holds tens of thousands of entries for as long as the process runs, so it is laid
// out for the garbage collector, which marks every live object at each cycle while
// decisions run: the index maps a hash of the text to a slot and holds no pointer, the
// recency list links slots by number, and each entry's ids and text share one
// allocation without pointers. An entry is one object to mark, not five.
type memo struct {
	mu      sync.Mutex
	limit   int64
	size    int64
	hash    func(text string) uint64 // seeded maphash; a test makes texts collide
	index   map[uint64]int32         // hash of the text → slot in entries
	entries []memoEntry              // slots; free ones are threaded through next
	free    int32                    // first free slot, or none
	// head and tail are the most and the least recently used slots, or none.
	head, tail   int32
	hits, misses uint64
}

type memoEntry struct {
	hash uint64
	// data holds the ids, then the text's bytes packed four to a word: ids first, so
	// they stay aligned.
	data      []uint32
	ids, text int32 // the number of ids and of text bytes in data
	// long is the bytes of long words encoding the text took (the budget's unit).
	long       int32
	prev, next int32
}

// newMemo returns nil (no memo) for a zero limit.
func newMemo(limit int64) *memo {
	if limit <= 0 {
		return nil
	}
	seed := maphash.MakeSeed()
	hash := func(text string) uint64 { return maphash.String(seed, text) }
	return &memo{limit: limit, hash: hash, index: map[uint64]int32{}, free: none, head: none, tail: none}
}

// entryCost is what an entry of textBytes of text and ids ids counts against the limit.
func entryCost(textBytes, ids int) int64 {
	return int64(textBytes) + 4*int64(ids) + memoEntryOverhead
}

// textOf returns the text an entry was stored under.
func (e *memoEntry) textOf() string {
	if e.text == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(&e.data[e.ids])), e.text)
}

// get returns the ids memoised for key, which must not be modified, and the bytes of
// long words their encoding took.
func (m *memo) get(key string) ([]uint32, int, bool) {
	h := m.hash(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	i, ok := m.index[h]
	// Two texts may share a hash: the entry is the key's only if its text is the key.
	if !ok || m.entries[i].textOf() != key {
		m.misses++
		return nil, 0, false
	}
	m.hits++
	m.unlink(i)
	m.pushFront(i)
	e := &m.entries[i]
	return e.data[:e.ids:e.ids], int(e.long), true
}

// put stores copies of key and ids (whose encoding took long bytes of long words), evicting the least recently used entries to stay
// within the limit. A single entry larger than the limit is not stored. An entry whose
// text has key's hash is replaced, whatever its text.
func (m *memo) put(key string, ids []uint32, long int) {
	cost := entryCost(len(key), len(ids))
	if cost > m.limit || long > math.MaxInt32 {
		return
	}
	// One allocation for both, copied before taking the lock.
	data := make([]uint32, len(ids)+(len(key)+3)/4)
	copy(data, ids)
	if len(key) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&data[len(ids)])), 4*(len(data)-len(ids))), key)
	}
	h := m.hash(key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.index[h]; ok {
		m.remove(old)
	}
	for m.size+cost > m.limit && m.tail != none {
		m.remove(m.tail)
	}
	i := m.free
	if i != none {
		m.free = m.entries[i].next
	} else {
		i = int32(len(m.entries))
		m.entries = append(m.entries, memoEntry{})
	}
	m.entries[i] = memoEntry{hash: h, data: data, ids: int32(len(ids)), text: int32(len(key)), long: int32(long), prev: none, next: none}
	m.index[h] = i
	m.pushFront(i)
	m.size += cost
}

// remove forgets the entry in slot i and frees the slot.
func (m *memo) remove(i int32) {
	e := &m.entries[i]
	m.size -= entryCost(int(e.text), int(e.ids))
	delete(m.index, e.hash)
	m.unlink(i)
	m.entries[i] = memoEntry{next: m.free, prev: none}
	m.free = i
}

func (m *memo) unlink(i int32) {
	e := &m.entries[i]
	if e.prev != none {
		m.entries[e.prev].next = e.next
	} else {
		m.head = e.next
	}
	if e.next != none {
		m.entries[e.next].prev = e.prev
	} else {
		m.tail = e.prev
	}
	e.prev, e.next = none, none
}

func (m *memo) pushFront(i int32) {
	e := &m.entries[i]
	e.prev, e.next = none, m.head
	if m.head != none {
		m.entries[m.head].prev = i
	}
	m.head = i
	if m.tail == none {
		m.tail = i
	}
}

func (m *memo) stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{MemoHits: m.hits, MemoMisses: m.misses, MemoBytes: m.size, MemoEntries: len(m.index)}
}

// none marks the end of the memo's recency list and of its free list.
const none int32 = -1
