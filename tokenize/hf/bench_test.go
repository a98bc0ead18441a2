package hf

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// chatTurn is the text of one turn of the benchmark conversation: prose, a list, code
// and numbers, varied by the turn number.
func chatTurn(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<|im_start|>user\nQuestion %d: our router sends chat requests to %d GPU workers. "+
		"Each worker keeps a prefix cache of %d blocks; explain how to pick the worker that "+
		"already holds the longest prefix, and what happens under load.<|im_end|>\n", n, 8+n, 1024*n)
	fmt.Fprintf(&b, "<|im_start|>assistant\nTurn %d. Routing by cache affinity works like this:\n\n", n)
	b.WriteString("1. Hash the prompt's token blocks (64 tokens each) with a chained hash, so a block's " +
		"hash names its whole prefix.\n2. Ask the index which workers hold each block; the overlap is the " +
		"number of leading blocks a worker holds.\n3. Score each worker: load plus the prefill the missing " +
		"blocks would cost, and pick the lowest.\n\n")
	fmt.Fprintf(&b, "```go\nfunc pick(ws []Worker, blocks []uint64) int {\n\tbest, bestCost := -1, math.Inf(1)\n"+
		"\tfor i, w := range ws {\n\t\tcost := w.Load() + %d*float64(len(blocks)-w.Overlap(blocks))\n"+
		"\t\tif cost < bestCost {\n\t\t\tbest, bestCost = i, cost\n\t\t}\n\t}\n\treturn best\n}\n```\n\n", n)
	fmt.Fprintf(&b, "Under load (say %d.%d requests per second), the prefill term dominates only while queues "+
		"are short; once a worker's queue exceeds %d requests, spreading beats affinity. Résumé: "+
		"measure, don't guess — p99 matters more than the mean. 🚀<|im_end|>\n", 40+n, n%10, 4+n%3)
	return b.String()
}

// conversation returns a system prompt and turns 1..n.
func conversation(n int) string {
	var b strings.Builder
	b.WriteString("<|im_start|>system\nYou are a careful assistant for platform engineers running LLM inference.<|im_end|>\n")
	for i := 1; i <= n; i++ {
		b.WriteString(chatTurn(i))
	}
	return b.String()
}

// benchPrompt is a 12-turn conversation of about 4,000 Qwen3 tokens.
func benchPrompt(tb testing.TB, tok *Tokenizer) (string, int) {
	tb.Helper()
	text := conversation(12) + "<|im_start|>assistant\n"
	ids, err := tok.Encode(text, false)
	require.NoError(tb, err)
	return text, len(ids)
}

func reportTokens(b *testing.B, tokens int) {
	b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(tokens), "tokens/op")
}

// BenchmarkEncodeCold4k: a 4k-token prompt with every cache empty (no memo, word cache
// cleared before each encode): the first prompt a fresh process sees.
func BenchmarkEncodeCold4k(b *testing.B) {
	tok := loadModel(b, "qwen3", Config{MemoBytes: 0})
	text, tokens := benchPrompt(b, tok)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		tok.model.cache = newWordCache(wordCacheEntries)
		b.StartTimer()
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
	reportTokens(b, tokens)
}

// BenchmarkEncodeNewText4k: a 4k-token prompt the memo has not seen, with a warm word
// cache: a new conversation in a running process.
func BenchmarkEncodeNewText4k(b *testing.B) {
	tok := loadModel(b, "qwen3", Config{MemoBytes: 0})
	text, tokens := benchPrompt(b, tok)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
	reportTokens(b, tokens)
}

// BenchmarkEncodeWarm4k: the same 4k-token prompt again: every piece comes from the memo.
func BenchmarkEncodeWarm4k(b *testing.B) {
	tok := loadModel(b, "qwen3", DefaultConfig())
	text, tokens := benchPrompt(b, tok)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
	reportTokens(b, tokens)
}

// BenchmarkEncodeTurn12: turn 12 of a conversation whose first 11 turns were encoded
// before: the history comes from the memo and the new turn (unique per iteration) is
// encoded.
func BenchmarkEncodeTurn12(b *testing.B) {
	tok := loadModel(b, "qwen3", DefaultConfig())
	history := conversation(11)
	_, err := tok.Encode(history, false)
	require.NoError(b, err)
	_, tokens := benchPrompt(b, tok)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		text := history + chatTurn(12+i) + "<|im_start|>assistant\n"
		if _, err := tok.Encode(text, false); err != nil {
			b.Fatal(err)
		}
	}
	reportTokens(b, tokens)
}

// liveHeap returns the bytes of live heap after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkLoadQwen3 loads the embedded Qwen3 tokenizer and reports the live heap it
// holds afterwards (empty memo).
func BenchmarkLoadQwen3(b *testing.B) {
	var heap uint64
	for i := 0; i < b.N; i++ {
		before := liveHeap()
		tok, err := LoadBuiltin("qwen3")
		if err != nil {
			b.Fatal(err)
		}
		heap = liveHeap() - before
		runtime.KeepAlive(tok)
	}
	b.ReportMetric(float64(heap)/(1<<20), "MB-live-heap")
}

// TestLoadBuiltinQwen3 loads the embedded tokenizer, pins the memory target (≤ 100 MB
// of live heap) and checks it against the golden ids.
func TestLoadBuiltinQwen3(t *testing.T) {
	before := liveHeap()
	tok, err := LoadBuiltin("qwen3")
	require.NoError(t, err)
	heap := liveHeap() - before
	t.Logf("live heap of a loaded Qwen3 tokenizer: %.1f MB", float64(heap)/(1<<20))
	require.Less(t, heap, uint64(100<<20))

	_, cases := readGolden(t, "qwen3")
	for _, c := range cases[:100] {
		got, err := tok.Encode(c.Text, false)
		require.NoError(t, err)
		require.Equal(t, c.IDs, got, "%q", c.Text)
	}
	_, err = LoadBuiltin("llama")
	require.ErrorContains(t, err, `no embedded model "llama"`)
}

// BenchmarkFullMemoHeap fills the default 32 MiB memo with unique conversation turns and
// reports the live heap of the tokenizer then: what a long-running process holds.
func BenchmarkFullMemoHeap(b *testing.B) {
	var heap uint64
	var stats Stats
	for i := 0; i < b.N; i++ {
		before := liveHeap()
		tok, err := LoadBuiltin("qwen3")
		require.NoError(b, err)
		for n := 0; tok.Stats().MemoBytes < DefaultConfig().MemoBytes*95/100; n++ {
			_, err := tok.Encode(chatTurn(n), false)
			require.NoError(b, err)
		}
		heap = liveHeap() - before
		stats = tok.Stats()
		runtime.KeepAlive(tok)
	}
	b.ReportMetric(float64(heap)/(1<<20), "MB-live-heap")
	b.ReportMetric(float64(stats.MemoBytes)/(1<<20), "MB-memo-accounted")
	b.ReportMetric(float64(stats.MemoEntries), "memo-entries")
}

// hostileTexts are 4 MiB prompts (the default max_body_bytes) built to make encoding
// expensive, and prose for comparison (about 4 bytes a token).
func hostileTexts() []struct{ name, text string } {
	const size = 4 << 20
	fill := func(s string, n int) string { return strings.Repeat(s, n/len(s)+1)[:n] }
	prose := "The router hashes each prompt's token blocks and asks the index which workers hold them; " +
		"under load it weighs the prefill a worker still owes against the blocks it would compute. " +
		"Measure first, then decide, and write down why. "
	cjk := "路由器把每个请求发送到已经缓存了最长前缀的工作节点。"
	return []struct{ name, text string }{
		{"spaces", fill(" ", size)},
		{"digits", fill("1234567890", 4_000_000)},
		{"letters", fill("a", size)},
		{"punctuation", fill("!?", size)},
		{"cjk", fill(cjk, size-size%3)},
		{"prose", fill(prose, size)},
	}
}

// BenchmarkHostilePrompt: each of hostileTexts encoded as the router encodes a
// completions prompt with the default max_prompt_tokens (1 << 20), memo off. ids/op is
// what the prefix holds, rest-bytes/op what it left out.
func BenchmarkHostilePrompt(b *testing.B) {
	tok := loadModel(b, "qwen3", Config{})
	for _, in := range hostileTexts() {
		b.Run(in.name, func(b *testing.B) {
			var ids []uint32
			var rest int
			for b.Loop() {
				var err error
				if ids, rest, err = tok.AppendEncodePrefix(nil, in.text, true, 1<<20); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)), "ids/op")
			b.ReportMetric(float64(rest), "rest-bytes/op")
		})
	}
}
