package template_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize/template"
)

// The render-cost survey (docs/BENCHMARKS.md "Hostile chats and the render's CPU"):
// chat bodies of hostile shapes, within max_body_bytes and the parser's value budget,
// rendered once each by every template of the golden corpus (Qwen3's config and the 97
// of ollama.json.gz, direct renderers included), its CPU printed as a table.

// hostileShape writes a chat request body of about size bytes.
type hostileShape struct {
	name  string
	write func(size int) []byte
}

func bodyOf(msgs []string, extra string) []byte {
	return []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `]` + extra + `}`)
}

func repeatTo(size int, first []string, each func(i int) string, last []string, extra func(n int) string) []byte {
	msgs := append([]string(nil), first...)
	total := 64
	for _, m := range append(append([]string(nil), first...), last...) {
		total += len(m) + 1
	}
	for i := 0; total < size; i++ {
		m := each(i)
		msgs = append(msgs, m)
		total += len(m) + 1
	}
	msgs = append(msgs, last...)
	x := ""
	if extra != nil {
		x = extra(len(msgs))
	}
	return bodyOf(msgs, x)
}

var hostileShapes = []hostileShape{
	{"alt-tiny", func(size int) []byte {
		return repeatTo(size, nil, func(i int) string {
			if i%2 == 0 {
				return `{"role":"user","content":"x"}`
			}
			return `{"role":"assistant","content":"x"}`
		}, []string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"system-tiny", func(size int) []byte {
		return repeatTo(size, nil, func(int) string { return `{"role":"system","content":"x"}` },
			[]string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"system-60", func(size int) []byte {
		c := strings.Repeat("abcdef ", 9)
		return repeatTo(size, nil, func(int) string { return `{"role":"system","content":"` + c + `"}` },
			[]string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"alt-60", func(size int) []byte {
		c := strings.Repeat("abcdef ", 9)
		return repeatTo(size, nil, func(i int) string {
			if i%2 == 0 {
				return `{"role":"user","content":"` + c + `"}`
			}
			return `{"role":"assistant","content":"` + c + `"}`
		}, []string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"tool-msgs", func(size int) []byte {
		return repeatTo(size, []string{`{"role":"user","content":"x"}`,
			`{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`},
			func(int) string { return `{"role":"tool","tool_call_id":"c","content":"x"}` }, nil, nil)
	}},
	{"tool-calls", func(size int) []byte {
		// alternating user / assistant with one call / tool result
		return repeatTo(size, nil, func(i int) string {
			switch i % 3 {
			case 0:
				return `{"role":"user","content":"x"}`
			case 1:
				return `{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}`
			}
			return `{"role":"tool","tool_call_id":"c","content":"x"}`
		}, []string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"many-calls-big-args", func(size int) []byte {
		// one assistant message with many calls whose arguments are escape-heavy
		arg := `{\"a\":\"` + strings.Repeat(`<>&'\\\"\\n`, 100) + `\"}`
		call := `{"id":"c","type":"function","function":{"name":"f","arguments":"` + arg + `"}}`
		n := size / (len(call) + 1)
		calls := make([]string, n)
		for i := range calls {
			calls[i] = call
		}
		return bodyOf([]string{`{"role":"user","content":"x"}`,
			`{"role":"assistant","content":"","tool_calls":[` + strings.Join(calls, ",") + `]}`,
			`{"role":"tool","tool_call_id":"c","content":"x"}`}, "")
	}},
	{"tools-many", func(size int) []byte {
		tool := `{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}`
		n := size / (len(tool) + 1)
		tools := make([]string, n)
		for i := range tools {
			tools[i] = tool
		}
		return bodyOf([]string{`{"role":"user","content":"x"}`}, `,"tools":[`+strings.Join(tools, ",")+`]`)
	}},
	{"tools-deep", func(size int) []byte {
		depth := 118 // body, tools, tool, function, parameters: the rest of 128
		tool := `{"type":"function","function":{"name":"f","parameters":` + strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth) + `}}`
		n := size / (len(tool) + 1)
		tools := make([]string, n)
		for i := range tools {
			tools[i] = tool
		}
		return bodyOf([]string{`{"role":"user","content":"x"}`}, `,"tools":[`+strings.Join(tools, ",")+`]`)
	}},
	{"tools-schema-deep", func(size int) []byte {
		// JSON schemas nested to max_json_depth: 59 levels of {"type":"object","properties":{"a":…}}
		const levels = 59
		schema := strings.Repeat(`{"type":"object","description":"d <&>","properties":{"a":`, levels) + `{"type":"string"}` + strings.Repeat(`}}`, levels)
		tool := `{"type":"function","function":{"name":"f","parameters":` + schema + `}}`
		n := max(1, size/(len(tool)+1))
		tools := make([]string, n)
		for i := range tools {
			tools[i] = tool
		}
		return bodyOf([]string{`{"role":"user","content":"x"}`}, `,"tools":[`+strings.Join(tools, ",")+`]`)
	}},
	{"documents", func(size int) []byte {
		doc := `{"title":"t","text":"x"}`
		n := size / (len(doc) + 1)
		docs := make([]string, n)
		for i := range docs {
			docs[i] = doc
		}
		return bodyOf([]string{`{"role":"user","content":"x"}`}, `,"documents":[`+strings.Join(docs, ",")+`]`)
	}},
	{"escape-long", func(size int) []byte {
		c := strings.Repeat(`<>&'\"\\\n\u00e9\u2028`, 200)
		return repeatTo(size, nil, func(i int) string {
			if i%2 == 0 {
				return `{"role":"user","content":"` + c + `"}`
			}
			return `{"role":"assistant","content":"` + c + `"}`
		}, []string{`{"role":"user","content":"x"}`}, nil)
	}},
	{"parts", func(size int) []byte {
		part := `{"type":"text","text":"x"}`
		n := size / (len(part) + 1)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = part
		}
		return bodyOf([]string{`{"role":"user","content":[` + strings.Join(parts, ",") + `]}`}, "")
	}},
}

type costTemplate struct {
	name string
	r    *template.Renderer
}

// costTemplates are Qwen3's config and the ollama corpus, as the goldens build them.
func costTemplates(t *testing.T) []costTemplate {
	now := func() time.Time { return time.Date(2025, 7, 26, 14, 5, 9, 0, time.UTC) }
	var out []costTemplate
	r, err := template.FromConfigFile(filepath.Join("testdata", "configs", "qwen3"), template.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, costTemplate{"config/qwen3", r})
	tokens := template.Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}}
	for _, e := range templatecorpus.All(t) {
		r, err := template.New(e.Template, tokens, template.Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, costTemplate{e.Model, r})
	}
	return out
}

// TestRenderCostSurvey prints the process CPU (GC workers included) and the bytes
// allocated by one Render of each hostile shape at each body size with each template.
// Not a test: it runs with KVROUTE_RENDER_COST=1, optionally restricted to
// KVROUTE_RENDER_COST_SIZES (KiB, comma-separated; default 256 to 4096),
// KVROUTE_RENDER_COST_TEMPLATES and KVROUTE_RENDER_COST_SHAPES (names, comma-separated).
// A template and shape that took more than 3 s are not tried at the larger sizes.
func TestRenderCostSurvey(t *testing.T) {
	if os.Getenv("KVROUTE_RENDER_COST") == "" {
		t.Skip("set KVROUTE_RENDER_COST=1")
	}
	sizes := []int{256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20}
	if s := os.Getenv("KVROUTE_RENDER_COST_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, _ := strconv.Atoi(f)
			sizes = append(sizes, n<<10)
		}
	}
	stopAt := 3 * time.Second
	only := os.Getenv("KVROUTE_RENDER_COST_TEMPLATES")
	onlyShapes := os.Getenv("KVROUTE_RENDER_COST_SHAPES")
	tmpls := costTemplates(t)
	stopped := map[string]bool{}
	fmt.Printf("template\tshape\tbody_KiB\tmessages\tpath\tresult\tcpu_ms\talloc_MB\tout_KB\n")
	for _, size := range sizes {
		for _, shape := range hostileShapes {
			if onlyShapes != "" && !strings.Contains(","+onlyShapes+",", ","+shape.name+",") {
				continue
			}
			body := shape.write(size)
			req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
			if err != nil {
				t.Fatalf("%s: %v", shape.name, err)
			}
			for _, tm := range tmpls {
				if only != "" && !strings.Contains(","+only+",", ","+tm.name+",") {
					continue
				}
				key := tm.name + "/" + shape.name
				if stopped[key] {
					continue
				}
				runtime.GC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				s0 := tm.r.Stats()
				c0 := cpuTime()
				out, err := tm.r.Render(req.Chat)
				cpu := cpuTime() - c0
				runtime.ReadMemStats(&m1)
				s1 := tm.r.Stats()
				path := "library"
				if s1.Direct > s0.Direct {
					path = "direct"
				}
				result := "ok"
				switch {
				case req.Chat.Unread != nil:
					result, path = "unread", "-"
				case err == nil:
				case errors.Is(err, template.ErrRenderTooSlow):
					result = "too_slow"
				case errors.Is(err, template.ErrOutputTooLarge):
					result = "too_large"
				case errors.Is(err, template.ErrTemplate):
					result = "raise"
				default:
					result = "error"
				}
				fmt.Printf("%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%d\n", tm.name, shape.name, len(body)>>10, len(req.Chat.Messages), path, result,
					cpu.Milliseconds(), (m1.TotalAlloc-m0.TotalAlloc)>>20, len(out)>>10)
				if cpu > stopAt {
					stopped[key] = true
				}
			}
		}
	}
}
