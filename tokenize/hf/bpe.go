package hf

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// bpe is the BPE model: it turns one pre-tokenized word into ids by applying merges in
// rank order, as the library's BPE::merge_word and Word::merge_all do.
type bpe struct {
	vocabSize int
	// vocab is kept after loading only for ignore_merges (whole-word lookups).
	vocab map[string]uint32
	// runeIDs holds the single-character tokens; lowRunes those below 512 (all of the
	// byte-level alphabet), -1 where none.
	runeIDs  map[rune]uint32
	lowRunes [512]int64
	// merges maps a pair of ids (left<<32 | right) to rank<<32 | merged id.
	merges       map[uint64]uint64
	byteFallback bool
	fallbackIDs  [256]int64 // the <0xXX> tokens; -1 where missing
	hasUnk       bool
	unkToken     string
	unkID        int64 // -1: unk_token is not in the vocabulary
	fuseUnk      bool
	ignoreMerges bool

	cache   *wordCache
	scratch sync.Pool // *mergeScratch
}

// symbol is a token of a word being merged: a doubly linked list over a slice, where a
// symbol merged into its left neighbour gets size 0.
type symbol struct {
	id         uint32
	prev, next int32
	size       int32
}

// mergeItem is a candidate merge of the symbol at pos with its right neighbour.
type mergeItem struct {
	rank, newID uint32
	pos         int32
}

type mergeScratch struct {
	symbols []symbol
	queue   []mergeItem
}

// trimmed drops the buffers grown past maxKeptEntries and returns sc, to be pooled: as
// for the encode's own scratch, one long word (a 1 MiB run of letters is one word for a
// byte-level pre-tokenizer) would otherwise keep tens of megabytes of symbols and queued
// merges alive for as long as encodes of uncached words keep reusing them.
func (sc *mergeScratch) trimmed() *mergeScratch {
	if cap(sc.symbols) > maxKeptEntries {
		sc.symbols = nil
	}
	if cap(sc.queue) > maxKeptEntries {
		sc.queue = nil
	}
	return sc
}

func pairKey(left, right uint32) uint64 { return uint64(left)<<32 | uint64(right) }

func (m *bpe) tokenID(s string) (uint32, bool) {
	id, ok := m.vocab[s]
	return id, ok
}

func (m *bpe) runeID(r rune) (uint32, bool) {
	if r >= 0 && r < rune(len(m.lowRunes)) {
		id := m.lowRunes[r]
		return uint32(id), id >= 0
	}
	id, ok := m.runeIDs[r]
	return id, ok
}

// maxCachedWord: the library caches words shorter than this many bytes too.
const maxCachedWord = 256

// encodeWord appends the ids of one word.
func (m *bpe) encodeWord(w string, ids []uint32) ([]uint32, error) {
	if w == "" {
		return ids, nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(ids, id), nil
		}
	}
	cacheable := m.cache != nil && len(w) < maxCachedWord
	if cacheable {
		if hit, ok := m.cache.get(w); ok {
			return append(ids, hit...), nil
		}
	}
	sc, _ := m.scratch.Get().(*mergeScratch)
	if sc == nil {
		sc = &mergeScratch{}
	}
	defer func() { m.scratch.Put(sc.trimmed()) }()
	syms, err := m.symbols(w, sc.symbols[:0])
	if err != nil {
		return nil, err
	}
	sc.queue = m.mergeAll(syms, sc.queue[:0])
	sc.symbols = syms
	start := len(ids)
	for _, s := range syms {
		if s.size != 0 {
			ids = append(ids, s.id)
		}
	}
	if cacheable {
		m.cache.put(w, ids[start:])
	}
	return ids, nil
}

// symbols splits w into characters looked up in the vocabulary, falling back to
// <0xXX> byte tokens, else to unk_token (fused over runs with fuse_unk), else dropping
// the character, in the library's order (a pending unk is emitted before the next known
// character, not before byte-fallback tokens).
func (m *bpe) symbols(w string, syms []symbol) ([]symbol, error) {
	add := func(id uint32, size int) {
		prev := int32(len(syms) - 1)
		if prev >= 0 {
			syms[prev].next = int32(len(syms))
		}
		syms = append(syms, symbol{id: id, prev: prev, next: -1, size: int32(size)})
	}
	unkPending, unkSize := false, 0
	for i := 0; i < len(w); {
		r, size := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+size]
		i += size
		if id, ok := m.runeID(r); ok {
			if unkPending {
				add(uint32(m.unkID), unkSize)
				unkPending = false
			}
			add(id, size)
			continue
		}
		if m.byteFallback && m.allBytesFallback(ch) {
			for j := 0; j < len(ch); j++ {
				add(uint32(m.fallbackIDs[ch[j]]), 1)
			}
			continue
		}
		if !m.hasUnk {
			continue
		}
		if m.unkID < 0 {
			return nil, fmt.Errorf("hf: unk_token %q is not in the vocabulary", m.unkToken)
		}
		switch {
		case unkPending && m.fuseUnk:
			unkSize += size
		case unkPending:
			add(uint32(m.unkID), unkSize)
			unkSize = size
		default:
			unkPending, unkSize = true, size
		}
	}
	if unkPending {
		add(uint32(m.unkID), unkSize)
	}
	return syms, nil
}

func (m *bpe) allBytesFallback(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.fallbackIDs[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// mergeAll applies merges lowest rank first, leftmost first among equal ranks, with a
// priority queue holding every adjacent pair that has a merge; entries made stale by an
// earlier merge are skipped when popped. It returns the queue's storage for reuse.
func (m *bpe) mergeAll(syms []symbol, q []mergeItem) []mergeItem {
	for i := 0; i+1 < len(syms); i++ {
		if v, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			q = pushItem(q, mergeItem{rank: uint32(v >> 32), newID: uint32(v), pos: int32(i)})
		}
	}
	for len(q) > 0 {
		var top mergeItem
		top, q = popItem(q)
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if v, ok := m.merges[pairKey(cur.id, right.id)]; !ok || uint32(v) != top.newID {
			continue // stale
		}
		cur.id = top.newID
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next >= 0 && int(right.next) < len(syms) {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if v, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				q = pushItem(q, mergeItem{rank: uint32(v >> 32), newID: uint32(v), pos: cur.prev})
			}
		}
		if cur.next >= 0 && int(cur.next) < len(syms) {
			if v, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				q = pushItem(q, mergeItem{rank: uint32(v >> 32), newID: uint32(v), pos: top.pos})
			}
		}
	}
	return q
}

func itemLess(a, b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// pushItem and popItem are a binary min-heap on (rank, pos).
func pushItem(q []mergeItem, it mergeItem) []mergeItem {
	q = append(q, it)
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !itemLess(q[i], q[parent]) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
	return q
}

func popItem(q []mergeItem) (mergeItem, []mergeItem) {
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l, r, min := 2*i+1, 2*i+2, i
		if l < len(q) && itemLess(q[l], q[min]) {
			min = l
		}
		if r < len(q) && itemLess(q[r], q[min]) {
			min = r
		}
		if min == i {
			break
		}
		q[i], q[min] = q[min], q[i]
		i = min
	}
	return top, q
}

// wordCache holds the ids of short words. It is sharded to keep lock contention low
// and bounded by clearing a shard when it fills, which costs nothing in exactness.
type wordCache struct {
	perShard int
	shards   [16]wordShard
}

type wordShard struct {
	mu sync.Mutex
	m  map[string][]uint32
}

func newWordCache(entries int) *wordCache {
	c := &wordCache{perShard: max(1, entries/16)}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(w string) *wordShard {
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(w); i++ {
		h = (h ^ uint32(w[i])) * 16777619
	}
	return &c.shards[h%uint32(len(c.shards))]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.Lock()
	ids, ok := s.m[w]
	s.mu.Unlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	s := c.shard(w)
	stored := append([]uint32(nil), ids...)
	s.mu.Lock()
	if len(s.m) >= c.perShard {
		clear(s.m)
	}
	s.m[string([]byte(w))] = stored
	s.mu.Unlock()
}
