package openai

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// renameAll runs body through a new renamer in chunks cut at cuts (ascending offsets).
func renameAll(target, requested string, events bool, body []byte, cuts ...int) []byte {
	r := NewModelRenamer(target, requested, events)
	var out []byte
	from := 0
	for _, c := range cuts {
		got, _ := r.Rename(body[from:c], false)
		out = append(out, got...)
		from = c
	}
	got, _ := r.Rename(body[from:], true)
	return append(out, got...)
}

func TestModelRenamerRenamesTheTopLevelModelAlone(t *testing.T) {
	const chunk = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":%s,"choices":[{"index":0,"delta":{"content":"hi"}}]}`
	tests := []struct {
		name   string
		events bool
		body   string
		want   string
	}{
		{"whole", false,
			`{"id":"c1","object":"chat.completion","model":"small-v1","choices":[{"message":{"content":"small-v1 says \"model\":\"small-v1\""}}],"usage":{"prompt_tokens":3}}`,
			`{"id":"c1","object":"chat.completion","model":"small","choices":[{"message":{"content":"small-v1 says \"model\":\"small-v1\""}}],"usage":{"prompt_tokens":3}}`},
		{"spaces and newlines kept", false, "{\n  \"model\" :\t \"small-v1\" ,\"x\":1}", "{\n  \"model\" :\t \"small\" ,\"x\":1}"},
		{"escapes in the key and the value", false, `{"mod\u0065l":"small\u002dv1"}`, `{"mod\u0065l":"small"}`},
		{"every duplicate", false, `{"model":"small-v1","model":"small-v1"}`, `{"model":"small","model":"small"}`},
		{"a nested model stays", false, `{"choices":[{"model":"small-v1"}],"meta":{"model":"small-v1"},"model":"small-v1"}`, `{"choices":[{"model":"small-v1"}],"meta":{"model":"small-v1"},"model":"small"}`},
		{"a value of model elsewhere stays", false, `{"note":"model","x":"small-v1","model":"small-v1"}`, `{"note":"model","x":"small-v1","model":"small"}`},
		{"another model stays", false, `{"model":"small-v10"}`, `{"model":"small-v10"}`},
		{"a prefix of the target stays", false, `{"model":"small-v"}`, `{"model":"small-v"}`},
		{"a non-string model stays", false, `{"model":["small-v1"],"m":{"model":null}}`, `{"model":["small-v1"],"m":{"model":null}}`},
		{"a top-level array is no object", false, `["model","small-v1",{"model":"small-v1"}]`, `["model","small-v1",{"model":"small-v1"}]`},
		{"an error body", false, `{"object":"error","message":"The model small-v1 does not exist.","type":"NotFoundError","code":404}`,
			`{"object":"error","message":"The model small-v1 does not exist.","type":"NotFoundError","code":404}`},
		{"not JSON", false, `model: "small-v1"`, `model: "small-v1"`},
		{"events", true,
			"data: " + sprintf(chunk, `"small-v1"`) + "\n\n: a comment {\"model\":\"small-v1\"}\nevent: x\n\ndata:" + sprintf(chunk, `"small-v1"`) + "\r\n\r\ndata: [DONE]\n\n",
			"data: " + sprintf(chunk, `"small"`) + "\n\n: a comment {\"model\":\"small-v1\"}\nevent: x\n\ndata:" + sprintf(chunk, `"small"`) + "\r\n\r\ndata: [DONE]\n\n"},
		{"an error event", true, `data: {"error":{"message":"small-v1 failed","model":"small-v1"}}` + "\n\n", `data: {"error":{"message":"small-v1 failed","model":"small-v1"}}` + "\n\n"},
		{"each data line is a document", true, "data: {\"x\":\"\ndata: \"model\":\"small-v1\"}\n\n", "data: {\"x\":\"\ndata: \"model\":\"small-v1\"}\n\n"},
		{"a value cut by its line", true, "data: {\"model\":\"small-v\ndata: 1\"}\n", "data: {\"model\":\"small-v\ndata: 1\"}\n"},
		{"a body cut inside the value", false, `{"model":"small-v1`, `{"model":"small-v1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRenameCuts(t, tt.events, tt.body, tt.want)
		})
	}
}

// checkRenameCuts checks that body renamed from small-v1 to small is want, whole and
// cut anywhere, once or at every byte.
func checkRenameCuts(t *testing.T, events bool, in, want string) {
	t.Helper()
	body := []byte(in)
	assert.Equal(t, want, string(renameAll("small-v1", "small", events, body)))
	for k := range len(body) + 1 {
		require.Equal(t, want, string(renameAll("small-v1", "small", events, body, k)), "cut at %d", k)
	}
	every := make([]int, len(body))
	for i := range every {
		every[i] = i
	}
	assert.Equal(t, want, string(renameAll("small-v1", "small", events, body, every...)))
	assert.Equal(t, in, string(body), "the input is not modified")
}

// An Anthropic Messages stream names the model in its message_start event's "message"
// object alone: that "model" (a member of the object that is a top-level "message"
// member's value) is renamed too, and nothing deeper or elsewhere.
func TestModelRenamerRenamesTheMessagesModel(t *testing.T) {
	const start = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":%s,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":0}}}`
	tests := []struct {
		name   string
		events bool
		body   string
		want   string
	}{
		{"message_start", true,
			"event: message_start\ndata: " + sprintf(start, `"small-v1"`) + "\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"model\\\":\\\"small-v1\\\"\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			"event: message_start\ndata: " + sprintf(start, `"small"`) + "\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"model\\\":\\\"small-v1\\\"\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
		{"message_start as one JSON body", false, sprintf(start, `"small-v1"`), sprintf(start, `"small"`)},
		{"spaces, escapes and both models", false,
			"{ \"m\\u0065ssage\" :\n{ \"model\" : \"small\\u002dv1\" , \"x\":1 } , \"model\":\"small-v1\"}",
			"{ \"m\\u0065ssage\" :\n{ \"model\" : \"small\" , \"x\":1 } , \"model\":\"small\"}"},
		{"every model member of message", false, `{"message":{"model":"small-v1","a":{"b":[1,{"c":2}]},"model":"small-v1"}}`, `{"message":{"model":"small","a":{"b":[1,{"c":2}]},"model":"small"}}`},
		{"another model stays", false, `{"message":{"model":"small-v10"}}`, `{"message":{"model":"small-v10"}}`},
		{"a message that is no object", false,
			`{"message":"small-v1","x":["message",{"model":"small-v1"}],"message":["model","small-v1",{"model":"small-v1"}],"message":null,"y":{"model":"small-v1"}}`,
			`{"message":"small-v1","x":["message",{"model":"small-v1"}],"message":["model","small-v1",{"model":"small-v1"}],"message":null,"y":{"model":"small-v1"}}`},
		{"a model deeper in message stays", false,
			`{"message":{"content":[{"type":"text","text":"\"model\":\"small-v1\""},{"model":"small-v1"}],"usage":{"model":"small-v1"},"message":{"model":"small-v1"}}}`,
			`{"message":{"content":[{"type":"text","text":"\"model\":\"small-v1\""},{"model":"small-v1"}],"usage":{"model":"small-v1"},"message":{"model":"small-v1"}}}`},
		{"an empty message, then the top level again", false, `{"message":{},"meta":{"model":"small-v1"},"model":"small-v1"}`, `{"message":{},"meta":{"model":"small-v1"},"model":"small"}`},
		{"a message below the top level stays", false, `{"x":{"message":{"model":"small-v1"}},"choices":[{"message":{"model":"small-v1"}}]}`, `{"x":{"message":{"model":"small-v1"}},"choices":[{"message":{"model":"small-v1"}}]}`},
		{"a chat completion", false,
			`{"id":"c1","object":"chat.completion","model":"small-v1","choices":[{"index":0,"message":{"role":"assistant","content":"I am small-v1","model":"small-v1"}}],"usage":{"prompt_tokens":3}}`,
			`{"id":"c1","object":"chat.completion","model":"small","choices":[{"index":0,"message":{"role":"assistant","content":"I am small-v1","model":"small-v1"}}],"usage":{"prompt_tokens":3}}`},
		{"chat completion chunks", true,
			"data: {\"model\":\"small-v1\",\"choices\":[{\"delta\":{\"content\":\"x\"},\"message\":{\"model\":\"small-v1\"}}]}\n\ndata: [DONE]\n\n",
			"data: {\"model\":\"small\",\"choices\":[{\"delta\":{\"content\":\"x\"},\"message\":{\"model\":\"small-v1\"}}]}\n\ndata: [DONE]\n\n"},
		{"an Anthropic error event", true, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"small-v1 failed\"}}\n\n", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"small-v1 failed\"}}\n\n"},
		{"a message cut by its line", true, "data: {\"message\":{\"id\":1,\ndata: \"model\":\"small-v1\"}}\n", "data: {\"message\":{\"id\":1,\ndata: \"model\":\"small-v1\"}}\n"},
		{"a top-level array is no object", false, `[{"message":{"model":"small-v1"}}]`, `[{"message":{"model":"small-v1"}}]`},
		{"a body cut inside message's model", false, `{"message":{"model":"small-v1`, `{"message":{"model":"small-v1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRenameCuts(t, tt.events, tt.body, tt.want)
		})
	}
}

func sprintf(format, model string) string {
	return string(bytes.Replace([]byte(format), []byte("%s"), []byte(model), 1))
}

// Only what may still be the target is held back, and a chunk with nothing to change is
// returned as it came, uncopied.
func TestModelRenamerHoldsBackOnlyAPossibleMatch(t *testing.T) {
	r := NewModelRenamer("small-v1", "small", false)
	in := []byte(`{"id":"x","model":"small`)
	out, changed := r.Rename(in, false)
	assert.True(t, changed)
	assert.Equal(t, `{"id":"x","model":`, string(out))
	out, changed = r.Rename([]byte(`-v1","choices":[]}`), true)
	assert.True(t, changed)
	assert.Equal(t, `"small","choices":[]}`, string(out))

	r = NewModelRenamer("small-v1", "small", false)
	in = []byte(`{"id":"x","model":"smalt`)
	out, changed = r.Rename(in, false)
	assert.False(t, changed, "the value is not the target: nothing held")
	assert.Equal(t, &in[0], &out[0], "the chunk itself")
	out, changed = r.Rename([]byte(`-v1"}`), true)
	assert.False(t, changed)
	assert.Equal(t, `-v1"}`, string(out))

	r = NewModelRenamer("small-v1", "small", true)
	out, changed = r.Rename([]byte(`data: {"model":"small-v1"`), false)
	assert.True(t, changed)
	assert.Equal(t, `data: {"model":"small"`, string(out))
	out, changed = r.Rename(nil, true)
	assert.False(t, changed)
	assert.Empty(t, out)
}

// A client's name that JSON escapes is written escaped.
func TestModelRenamerWritesTheRequestedNameAsJSON(t *testing.T) {
	got := renameAll("t", "a\"<b>\n", true, []byte("data: {\"model\":\"t\"}\n\n"))
	assert.Equal(t, "data: {\"model\":\"a\\\"\\u003cb\\u003e\\n\"}\n\n", string(got))
}

// FuzzModelRenamer: whatever the body and wherever it is cut, the output is the same as
// in one chunk; and in a JSON object (the body, or each data line of an event stream)
// only a top-level "model", or a "model" member of the object that is a top-level
// "message" member's value, whose value is the target changes, to the client's name.
func FuzzModelRenamer(f *testing.F) {
	for _, s := range []string{
		`{"id":"c1","model":"t","choices":[{"text":"\"model\":\"t\""}],"usage":{"prompt_tokens":3}}`,
		`{"mod\u0065l":"\u0074","model":"t2","model":"t"}`,
		"data: {\"model\":\"t\"}\n\n: c\ndata: [DONE]\r\n",
		`{"error":{"model":"t"}}`, `["model","t"]`, `{"model":"t`, "", `"`,
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[{\"model\":\"t\"}],\"model\":\"t\"}}\n\n",
		`{"message":{},"model":"t","m\u0065ssage":{"mod\u0065l":"\u0074","x":{"model":"t"}}}`,
		`{"message":"t","message":[{"model":"t"}],"choices":[{"message":{"model":"t"}}]}`,
	} {
		f.Add([]byte(s), "t", "client", false, []byte{3, 7})
		f.Add([]byte(s), "t", "client", true, []byte{1})
	}
	f.Fuzz(func(t *testing.T, body []byte, target, requested string, events bool, cuts []byte) {
		whole := renameAll(target, requested, events, body)
		var at []int
		for _, c := range cuts {
			if len(at) > 0 {
				c += byte(at[len(at)-1])
			}
			if int(c) > len(body) || len(at) > 0 && int(c) < at[len(at)-1] {
				break
			}
			at = append(at, int(c))
		}
		if got := renameAll(target, requested, events, body, at...); !bytes.Equal(got, whole) {
			t.Fatalf("cut at %v: %q, in one chunk %q", at, got, whole)
		}
		if !events {
			checkRenamed(t, body, whole, target, requested)
			return
		}
		in, out := lines(body), lines(whole)
		if len(in) != len(out) {
			t.Fatalf("%d lines became %d", len(in), len(out))
		}
		for i := range in {
			if v, ok := bytes.CutPrefix(in[i], []byte("data:")); ok {
				w, ok := bytes.CutPrefix(out[i], []byte("data:"))
				if !ok {
					t.Fatalf("data line %q became %q", in[i], out[i])
				}
				checkRenamed(t, v, w, target, requested)
			} else if !bytes.Equal(in[i], out[i]) {
				t.Fatalf("line %q became %q", in[i], out[i])
			}
		}
	})
}

func lines(b []byte) [][]byte {
	return bytes.FieldsFunc(b, func(r rune) bool { return r == '\n' || r == '\r' })
}

// checkRenamed checks out against in, when in is one JSON object.
func checkRenamed(t *testing.T, in, out []byte, target, requested string) {
	t.Helper()
	var before map[string]json.RawMessage
	if trimmed := bytes.TrimSpace(in); len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(in, &before) != nil {
		return
	}
	var after map[string]json.RawMessage
	if err := json.Unmarshal(out, &after); err != nil {
		t.Fatalf("%q became %q, not JSON: %v", in, out, err)
	}
	// The client's name as JSON carries it (invalid UTF-8 replaced).
	enc, _ := json.Marshal(requested)
	_ = json.Unmarshal(enc, &requested)
	checkMembers(t, in, out, before, after, target, requested, true)
}

// checkMembers checks an object's members after renaming against before: at the top
// level, and in the object that is the top-level "message" member's value.
func checkMembers(t *testing.T, in, out []byte, before, after map[string]json.RawMessage, target, requested string, top bool) {
	t.Helper()
	for k, v := range before {
		var model string
		if k == "model" && json.Unmarshal(v, &model) == nil && model == target {
			if err := json.Unmarshal(after[k], &model); err != nil || model != requested {
				t.Fatalf("%q became %q: model %s, want %q", in, out, after[k], requested)
			}
			continue
		}
		var inner map[string]json.RawMessage
		if top && k == "message" && len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &inner) == nil {
			var innerAfter map[string]json.RawMessage
			if err := json.Unmarshal(after[k], &innerAfter); err != nil {
				t.Fatalf("%q became %q: message %s, not an object: %v", in, out, after[k], err)
			}
			checkMembers(t, in, out, inner, innerAfter, target, requested, false)
			continue
		}
		if !bytes.Equal(v, after[k]) {
			t.Fatalf("%q became %q: %q is %s, was %s", in, out, k, after[k], v)
		}
	}
	if len(after) != len(before) {
		t.Fatalf("%q became %q", in, out)
	}
}

// BenchmarkModelRenamer renames a streamed chat completion (top-level model in every
// chunk) and a Messages stream (the model in message_start's message), each event its
// own chunk.
func BenchmarkModelRenamer(b *testing.B) {
	const chatChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"small-v1","choices":[{"index":0,"delta":{"content":"some words here"},"finish_reason":null}]}` + "\n\n"
	var chat [][]byte
	for range 64 {
		chat = append(chat, []byte(chatChunk))
	}
	chat = append(chat, []byte("data: [DONE]\n\n"))
	messages := [][]byte{[]byte("event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"small-v1","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":0}}}` + "\n\n")}
	for range 64 {
		messages = append(messages, []byte("event: content_block_delta\ndata: "+`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"some words here"}}`+"\n\n"))
	}
	messages = append(messages, []byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	for _, bc := range []struct {
		name   string
		chunks [][]byte
	}{{"chat", chat}, {"messages", messages}} {
		b.Run(bc.name, func(b *testing.B) {
			n := 0
			for _, c := range bc.chunks {
				n += len(c)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				r := NewModelRenamer("small-v1", "small", true)
				for i, c := range bc.chunks {
					r.Rename(c, i == len(bc.chunks)-1)
				}
			}
		})
	}
}
