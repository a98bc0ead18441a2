package hf

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// heapAfterSmallEncode is the heap in use after a collection that follows a small
// encode, as in a server that encodes between any two collections: what the encode
// buffers' pool keeps then stays kept.
func heapAfterSmallEncode(t *testing.T, tok *Tokenizer) uint64 {
	t.Helper()
	runtime.GC()
	_, err := tok.Encode("a small request", false)
	require.NoError(t, err)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestEncodeKeepsNoLargeBuffer pins that the pooled encode buffers do not keep what one
// large piece grew them to. Before, a 1 MiB message (one piece between special tokens)
// left about 37 MB of buffers alive for as long as encodes kept reusing them.
func TestEncodeKeepsNoLargeBuffer(t *testing.T) {
	// One P, so the small encodes get the pooled scratch the large one put back (a
	// pool's entries are per P).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	sentence := "The quick brown fox jumps over the lazy dog, 12345 times. "
	tokenizers := map[string]func() *Tokenizer{
		"qwen3 (byte-level)": func() *Tokenizer { return loadModel(t, "qwen3", Config{}) },
		"mistral7b-metaspace-split": func() *Tokenizer {
			for _, v := range readVariants(t) {
				if v.Name == "mistral7b-metaspace-split" {
					tok, err := Parse(v.apply(t, modelFile(t, v.Base)), Config{})
					require.NoError(t, err)
					return tok
				}
			}
			t.Fatal("no variant mistral7b-metaspace-split")
			return nil
		},
	}
	for name, load := range tokenizers {
		t.Run(name, func(t *testing.T) {
			tok := load()
			before := heapAfterSmallEncode(t, tok)
			encodeAndDrop(t, tok, func() string { return strings.Repeat(sentence, 1<<20/len(sentence)) })
			after := heapAfterSmallEncode(t, tok)
			require.Less(t, int64(after)-int64(before), int64(512<<10),
				"heap grew by %d KiB after the large encode", (int64(after)-int64(before))>>10)
		})
	}
}

// heapAfterNewWordEncode is heapAfterSmallEncode with a word the word cache has not
// seen, as most requests of a server bring: the encode takes a merge scratch from the
// BPE model's pool, as every uncached word does.
func heapAfterNewWordEncode(t *testing.T, tok *Tokenizer, i int) uint64 {
	t.Helper()
	runtime.GC()
	_, err := tok.Encode(fmt.Sprintf("a small request zq%dxv", i), false)
	require.NoError(t, err)
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestEncodeKeepsNoLargeMergeBuffer pins that the BPE model's pooled merge scratch
// (16 bytes a character for the symbols, 12 a queued merge) does not keep what one long
// word grew it to. A 1 MiB run of letters is one word for Qwen3's pre-tokenizer (a
// Metaspace model without split makes a whole segment one word); before, it left about
// 31 MB alive for as long as encodes of uncached words kept reusing the scratch.
func TestEncodeKeepsNoLargeMergeBuffer(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	tok := loadModel(t, "qwen3", Config{})
	before := heapAfterNewWordEncode(t, tok, 0)
	encodeAndDrop(t, tok, func() string { return strings.Repeat("A", 1<<20) })
	after := heapAfterNewWordEncode(t, tok, 1)
	after = max(after, heapAfterNewWordEncode(t, tok, 2)) // still there a collection later
	require.Less(t, int64(after)-int64(before), int64(512<<10),
		"heap grew by %d KiB after one 1 MiB word", (int64(after)-int64(before))>>10)
}

// encodeAndDrop encodes text() and keeps nothing of it.
//
//go:noinline
func encodeAndDrop(t *testing.T, tok *Tokenizer, text func() string) {
	_, err := tok.Encode(text(), false)
	require.NoError(t, err)
}
