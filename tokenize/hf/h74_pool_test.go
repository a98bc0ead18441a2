package hf

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

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

// h74: TestEncodeKeepsNoLargeBuffer encodes a long text of short words. One long word
// (a 1 MiB run of letters is one word for Qwen3's pre-tokenizer; a Metaspace model
// without split makes a whole segment one word) grows the BPE model's own pooled
// mergeScratch (bpe.scratch: 16 bytes a character for the symbols, 12 a queued merge),
// which scratch.trimmed does not cover: it stays alive for as long as encodes of
// uncached words keep reusing it.
func TestH74EncodeKeepsNoLargeMergeBuffer(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	tok := loadModel(t, "qwen3", Config{})
	before := heapAfterNewWordEncode(t, tok, 0)
	encodeAndDrop(t, tok, func() string { return strings.Repeat("A", 1<<20) })
	after := heapAfterNewWordEncode(t, tok, 1)
	after = max(after, heapAfterNewWordEncode(t, tok, 2)) // still there a collection later
	require.Less(t, int64(after)-int64(before), int64(512<<10),
		"heap grew by %d KiB after one 1 MiB word", (int64(after)-int64(before))>>10)
}
