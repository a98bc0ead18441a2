package openai

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// hostileBody builds a body of about n bytes of one hostile shape, for
// BenchmarkParseHostile: parse time over the body's size should not grow with the size.
func hostileBody(shape string, n int) (Endpoint, []byte) {
	var b strings.Builder
	repeat := func(s string) string { return strings.Repeat(s, max(1, n/len(s))) }
	chat := func(extra string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"x"` + extra + `}]}`)
	}
	switch shape {
	case "escapes": // a content of nothing but escapes
		return ChatCompletions, chat(`,"name":"` + repeat(`\n\"\\\u00e9\ud83d\ude00`) + `"`)
	case "lone-surrogates": // every escape a high surrogate the next does not pair
		return ChatCompletions, chat(`,"name":"` + repeat(`\ud800`) + `"`)
	case "numbers-read": // tiny numbers in a message (materialised, within the budget)
		return ChatCompletions, chat(`,"n":[0` + repeat(`,0`) + `]`)
	case "numbers-skipped": // tiny numbers in a field nobody reads
		return ChatCompletions, []byte(`{"model":"m","x":[0` + repeat(`,0`) + `],"messages":[{"role":"user","content":"x"}]}`)
	case "token-ids":
		return Completions, []byte(`{"model":"m","prompt":[1` + repeat(`,123456`) + `]}`)
	case "token-ids-lax": // ids pydantic's lax int reads, each one converted
		return Completions, []byte(`{"model":"m","prompt":[1` + repeat(`,"1",1.0,true`) + `]}`)
	case "deep-read", "deep-skipped": // arrays at the depth limit (128), one after another
		deep := strings.Repeat("[", 123) + strings.Repeat("]", 123)
		if shape == "deep-read" {
			return ChatCompletions, chat(`,"d":[` + deep + repeat(","+deep) + `]`)
		}
		return ChatCompletions, []byte(`{"model":"m","x":[` + deep + repeat(","+deep) + `],"messages":[{"role":"user","content":"x"}]}`)
	case "many-keys", "same-key", "long-prefix-keys":
		// One message object of many members, each value long enough for the chat to be
		// read within the value budget, so that its members are deduplicated.
		b.WriteString(`{"model":"m","messages":[{"role":"user","content":"x"`)
		prefix := ""
		if shape == "long-prefix-keys" {
			prefix = strings.Repeat("k", 200)
		}
		for i := 0; b.Len() < n; i++ {
			switch shape {
			case "same-key":
				b.WriteString(`,"k":"0123456789abcdef"`)
			default:
				b.WriteString(`,"` + prefix + strconv.Itoa(i) + `":"0123456789abcdef"`)
			}
		}
		b.WriteString(`}]}`)
		return ChatCompletions, []byte(b.String())
	}
	panic(shape)
}

// BenchmarkParseHostile is Parse on bodies of one hostile shape at two sizes: its ns per
// byte (from MB/s) should be the same at both, whatever the shape (docs/BENCHMARKS.md).
func BenchmarkParseHostile(b *testing.B) {
	for _, shape := range []string{"escapes", "lone-surrogates", "numbers-read", "numbers-skipped", "token-ids", "token-ids-lax",
		"deep-read", "deep-skipped", "many-keys", "same-key", "long-prefix-keys"} {
		for _, size := range []int{256 << 10, 2 << 20} {
			endpoint, body := hostileBody(shape, size)
			b.Run(fmt.Sprintf("%s/%dKiB", shape, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Parse(endpoint, body, DefaultLimits()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
