package template_test

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize/template"
)

// chat12Turns is a request body of a system prompt and 12 user turns with 11 assistant
// answers between them, about 16,000 characters (~4,000 Qwen3 tokens) of seeded
// English-like text, with the given chat_template_kwargs (none if nil).
func chat12Turns(kwargs map[string]any) []byte {
	words := strings.Fields("the a to of and in is it for on that with as this be are by at from or an was will can not how what when which model token cache prefix router worker request latency block engine memory prompt chat turn answer question route load score kv")
	rng := rand.New(rand.NewPCG(1, 2))
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return strings.TrimSpace(b.String())
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", text(800)}}
	for turn := range 12 {
		msgs = append(msgs, msg{"user", text(500)})
		if turn < 11 {
			msgs = append(msgs, msg{"assistant", text(800)})
		}
	}
	request := map[string]any{"model": "qwen3", "messages": msgs}
	if kwargs != nil {
		request["chat_template_kwargs"] = kwargs
	}
	body, err := json.Marshal(request)
	if err != nil {
		panic(err)
	}
	return body
}

// BenchmarkRenderQwen3Chat12Turns renders turn 12 of a 12-turn, ~4k-token chat with
// Qwen3's template (compiled once, at load, outside the loop). direct: the chat as is,
// which Qwen3's direct renderer takes. jinja: the same chat with a chat_template_kwargs
// key the template ignores and the direct renderer does not take, so it goes through
// the library: message preparation, value conversion and the Jinja render.
func BenchmarkRenderQwen3Chat12Turns(b *testing.B) {
	r, err := template.FromConfigFile(filepath.Join("testdata", "configs", "qwen3"), template.Options{})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkDirectAndJinja(b, r)
}

// BenchmarkRenderLlama31Chat12Turns renders turn 12 of the same chat with Llama 3.1
// Instruct's template (Llama 3.3's is the same bytes), its source the committed
// ollama.json.gz entry; direct and jinja as for Qwen3.
func BenchmarkRenderLlama31Chat12Turns(b *testing.B) {
	tokens := template.Tokens{Named: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}}
	r, err := template.New(templatecorpus.Ollama(b, "library/llama3.1:8b"), tokens, template.Options{})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkDirectAndJinja(b, r)
}

// benchmarkDirectAndJinja renders the 12-turn chat with r twice over: as is (direct,
// for a template with a direct renderer) and with a chat_template_kwargs key the
// template ignores, which no direct renderer takes (jinja).
func benchmarkDirectAndJinja(b *testing.B, r *template.Renderer) {
	for _, bench := range []struct {
		name   string
		kwargs map[string]any
	}{{"direct", nil}, {"jinja", map[string]any{"unused_by_the_template": true}}} {
		b.Run(bench.name, func(b *testing.B) {
			req, err := openai.Parse(openai.ChatCompletions, chat12Turns(bench.kwargs), openai.DefaultLimits())
			if err != nil {
				b.Fatal(err)
			}
			out, err := r.Render(req.Chat)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := r.Render(req.Chat); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(len(out)), "prompt_bytes")
		})
	}
}

// cpuTime is the process's user and system CPU time (GC workers included). On a shared
// machine it measures the work per render where wall-clock ns/op also counts waiting
// for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoadQwen3 is what the renderer saves by compiling at load: reading and
// parsing tokenizer_config.json, resolving whitespace, compiling the template and
// detecting its content format.
func BenchmarkLoadQwen3(b *testing.B) {
	config, err := os.ReadFile(filepath.Join("testdata", "configs", "qwen3", "tokenizer_config.json"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := template.FromConfig(config, template.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
