package hf

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemoEvictsLeastRecentlyUsedWithinItsBytes(t *testing.T) {
	key := func(c byte) string { return strings.Repeat(string(c), 100) }
	cost := entryCost(len(key('a')), 2)
	m := newMemo(3 * cost)
	m.put(key('a'), []uint32{1, 2}, 0)
	m.put(key('b'), []uint32{3, 4}, 0)
	m.put(key('c'), []uint32{5, 6}, 0)
	_, _, ok := m.get(key('a')) // a becomes the most recently used
	require.True(t, ok)
	m.put(key('d'), []uint32{7, 8}, 0) // evicts b, the least recently used

	_, _, okB := m.get(key('b'))
	assert.False(t, okB)
	for _, c := range []byte("acd") {
		_, _, ok := m.get(key(c))
		assert.True(t, ok, string(c))
	}
	s := m.stats()
	assert.Equal(t, 3, s.MemoEntries)
	assert.Equal(t, 3*cost, s.MemoBytes)
	assert.Equal(t, uint64(4), s.MemoHits)
	assert.Equal(t, uint64(1), s.MemoMisses)
}

func TestMemoStoresCopies(t *testing.T) {
	m := newMemo(1 << 20)
	ids := []uint32{1, 2, 3}
	buf := []byte(strings.Repeat("k", 40))
	m.put(string(buf), ids, 0)
	ids[0] = 99
	got, _, ok := m.get(strings.Repeat("k", 40))
	require.True(t, ok)
	assert.Equal(t, []uint32{1, 2, 3}, got)
}

func TestMemoSkipsEntriesLargerThanItsLimit(t *testing.T) {
	m := newMemo(200)
	m.put(strings.Repeat("x", 300), []uint32{1}, 0)
	assert.Equal(t, 0, m.stats().MemoEntries)
	m.put(strings.Repeat("y", 40), []uint32{1}, 0)
	m.put(strings.Repeat("y", 40), []uint32{1}, 0) // replacing keeps one entry
	assert.Equal(t, 1, m.stats().MemoEntries)
	assert.Equal(t, entryCost(40, 1), m.stats().MemoBytes)
	assert.Nil(t, newMemo(0))
}

// TestMemoServesRepeatedTurns: encoding turn 12 of a conversation after turn 11 finds
// the whole history in the memo, and the ids equal a memo-less encoding.
func TestMemoServesRepeatedTurns(t *testing.T) {
	tok := loadModel(t, "qwen3", DefaultConfig())
	plain := loadModel(t, "qwen3", Config{})
	_, err := tok.Encode(conversation(11), false)
	require.NoError(t, err)
	before := tok.Stats()

	text := conversation(12)
	got, err := tok.Encode(text, false)
	require.NoError(t, err)
	want, err := plain.Encode(text, false)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	after := tok.Stats()
	hits, misses := after.MemoHits-before.MemoHits, after.MemoMisses-before.MemoMisses
	assert.Greater(t, hits, 3*misses, "hits %d, misses %d", hits, misses)
}

// TestMemoKeepsTheInputStartApart: with Metaspace's prepend_scheme "first", the same
// text encodes differently at the start of the input and after an added token; the memo
// must not serve one for the other.
func TestMemoKeepsTheInputStartApart(t *testing.T) {
	var v variant
	for _, x := range readVariants(t) {
		if x.Name == "mistral7b-metaspace-first" {
			v = x
		}
	}
	require.Equal(t, "mistral7b-metaspace-first", v.Name)
	data := v.apply(t, modelFile(t, "mistral7b"))
	tok, err := Parse(data, DefaultConfig())
	require.NoError(t, err)
	plain, err := Parse(data, Config{})
	require.NoError(t, err)
	piece := "the same sentence, long enough to be memoised"
	for _, text := range []string{piece, "[INST]" + piece, piece, "[INST]" + piece} {
		got, err := tok.Encode(text, false)
		require.NoError(t, err)
		want, err := plain.Encode(text, false)
		require.NoError(t, err)
		assert.Equal(t, want, got, text)
	}
	first, _ := plain.Encode(piece, false)
	after, _ := plain.Encode("[INST]"+piece, false)
	assert.NotEqual(t, first, after[1:], "the case must tell the two apart")
}

// TestConcurrentEncode runs overlapping conversations from several goroutines (run it
// with -race) and checks each result against a memo-less tokenizer.
func TestConcurrentEncode(t *testing.T) {
	tok := loadModel(t, "qwen3", Config{MemoBytes: 64 << 10}) // small: eviction happens
	plain := loadModel(t, "qwen3", Config{})
	want := map[int][]uint32{}
	for n := 1; n <= 6; n++ {
		ids, err := plain.Encode(conversation(n), true)
		require.NoError(t, err)
		want[n] = ids
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				n := 1 + (g+i)%6
				got, err := tok.Encode(conversation(n), true)
				if err == nil && fmt.Sprint(got) != fmt.Sprint(want[n]) {
					err = fmt.Errorf("goroutine %d, conversation %d: ids differ", g, n)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.LessOrEqual(t, tok.Stats().MemoBytes, int64(64<<10))
}

// TestMemoTellsTextsThatShareAHashApart: the memo finds entries by a hash of their text,
// so two texts with one hash must not be taken for each other: the second's put
// replaces the first, and each get answers only for its own text.
func TestMemoTellsTextsThatShareAHashApart(t *testing.T) {
	m := newMemo(1 << 20)
	m.hash = func(string) uint64 { return 7 } // every text collides
	m.put("first text", []uint32{1, 2}, 0)
	_, _, ok := m.get("other text")
	assert.False(t, ok, "a text sharing the hash was answered with another's ids")
	got, _, ok := m.get("first text")
	require.True(t, ok)
	assert.Equal(t, []uint32{1, 2}, got)

	m.put("second", []uint32{3}, 0)
	_, _, ok = m.get("first text")
	assert.False(t, ok, "the replaced entry still answers")
	got, _, ok = m.get("second")
	require.True(t, ok)
	assert.Equal(t, []uint32{3}, got)
	s := m.stats()
	assert.Equal(t, 1, s.MemoEntries)
	assert.Equal(t, entryCost(len("second"), 1), s.MemoBytes)
}

// TestMemoKeepsTextsOfEveryLength: an entry's text is packed after its ids four bytes
// to a word; texts of every length up to a few words, and none, come back whole.
func TestMemoKeepsTextsOfEveryLength(t *testing.T) {
	m := newMemo(1 << 20)
	for n := range 13 {
		key := strings.Repeat("é", n/2) + strings.Repeat("k", n%2)
		ids := make([]uint32, n%3)
		for i := range ids {
			ids[i] = uint32(100*n + i)
		}
		m.put(key, ids, 0)
		got, _, ok := m.get(key)
		require.True(t, ok, "length %d", len(key))
		assert.Equal(t, ids, got, "length %d", len(key))
		assert.Equal(t, len(ids), cap(got), "the ids must not be appendable into the text")
	}
}
