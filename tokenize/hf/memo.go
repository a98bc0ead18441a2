package hf

import (
	"strings"
	"sync"
)

// memoEntryOverhead approximates the bytes an entry costs beyond its text and ids: the
// map slot, the entry struct and two slice/string headers.
const memoEntryOverhead = 128

// memo maps a piece of normalized text to its ids, least recently used evicted first,
// bounded by the bytes it holds. One mutex guards it: a lookup is a map probe and two
// pointer moves, short next to encoding a piece.
type memo struct {
	mu      sync.Mutex
	limit   int64
	size    int64
	entries map[string]*memoEntry
	// head is a sentinel of the recency list: head.next is the most recently used.
	head         memoEntry
	hits, misses uint64
}

type memoEntry struct {
	key        string
	ids        []uint32
	prev, next *memoEntry
}

// newMemo returns nil (no memo) for a zero limit.
func newMemo(limit int64) *memo {
	if limit <= 0 {
		return nil
	}
	m := &memo{limit: limit, entries: map[string]*memoEntry{}}
	m.head.prev, m.head.next = &m.head, &m.head
	return m
}

func entryCost(key string, ids []uint32) int64 {
	return int64(len(key)) + 4*int64(len(ids)) + memoEntryOverhead
}

// get returns the ids memoised for key; they must not be modified.
func (m *memo) get(key string) ([]uint32, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok {
		m.misses++
		return nil, false
	}
	m.hits++
	m.unlink(e)
	m.pushFront(e)
	return e.ids, true
}

// put stores copies of key and ids, evicting the least recently used entries to stay
// within the limit. A single entry larger than the limit is not stored.
func (m *memo) put(key string, ids []uint32) {
	cost := entryCost(key, ids)
	if cost > m.limit {
		return
	}
	key = strings.Clone(key) // the caller's key may be a slice of a large prompt
	stored := append([]uint32(nil), ids...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.entries[key]; ok {
		m.size -= entryCost(old.key, old.ids)
		m.unlink(old)
		delete(m.entries, key)
	}
	for m.size+cost > m.limit && m.head.prev != &m.head {
		oldest := m.head.prev
		m.size -= entryCost(oldest.key, oldest.ids)
		m.unlink(oldest)
		delete(m.entries, oldest.key)
	}
	e := &memoEntry{key: key, ids: stored}
	m.entries[key] = e
	m.pushFront(e)
	m.size += cost
}

func (m *memo) unlink(e *memoEntry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

func (m *memo) pushFront(e *memoEntry) {
	e.prev = &m.head
	e.next = m.head.next
	m.head.next.prev = e
	m.head.next = e
}

func (m *memo) stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{MemoHits: m.hits, MemoMisses: m.misses, MemoBytes: m.size, MemoEntries: len(m.entries)}
}
