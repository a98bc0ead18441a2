package openai

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readID feeds body to a new reader in the given chunks and returns its result,
// checking after every chunk that the reader holds no more than MaxResponseIDScan bytes.
func readID(t *testing.T, chunks ...[]byte) (id string, done bool) {
	t.Helper()
	var r ResponseIDReader
	for _, c := range chunks {
		id, done = r.Write(c)
		require.LessOrEqual(t, r.retained(), MaxResponseIDScan)
	}
	return id, done
}

// requireSameEverySplit checks that body gives want (and wantDone) read whole, cut in
// two at every offset (or every stride-th, for a long body, and around the scan
// bound), and fed one byte at a time: where the chunks split must not matter.
func requireSameEverySplit(t *testing.T, body []byte, want string, wantDone bool) {
	t.Helper()
	id, done := readID(t, body)
	require.Equal(t, want, id, "whole")
	require.Equal(t, wantDone, done, "whole")
	stride := 1
	if len(body) > 4096 {
		stride = 997
	}
	for i := 0; i <= len(body); i++ {
		near := i > MaxResponseIDScan-8 && i < MaxResponseIDScan+8
		if i%stride != 0 && !near && i != len(body) {
			continue
		}
		id, done := readID(t, body[:i], body[i:])
		require.Equal(t, want, id, "cut at %d", i)
		require.Equal(t, wantDone, done, "cut at %d", i)
	}
	var r ResponseIDReader
	for i := range body {
		id, done = r.Write(body[i : i+1])
		if done {
			break
		}
	}
	require.Equal(t, want, id, "byte by byte")
	require.Equal(t, wantDone, done, "byte by byte")
	require.LessOrEqual(t, r.retained(), MaxResponseIDScan)
}

// vllmResponse is a whole vLLM response in vLLM's member order, with an output item
// and usage, whose own ids must not be taken.
const vllmResponse = `{"id":"resp_0b5f","created_at":1750000000,"incomplete_details":null,"instructions":null,` +
	`"metadata":null,"model":"m","object":"response","output":[{"id":"msg_9","content":[{"annotations":[],` +
	`"text":"Hello \"id\": \"fake\"","type":"output_text","logprobs":null}],"role":"assistant","status":"completed",` +
	`"type":"message"}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,` +
	`"background":false,"max_output_tokens":100,"previous_response_id":"resp_prev","reasoning":null,` +
	`"service_tier":"auto","status":"completed","text":null,"top_logprobs":0,"truncation":"disabled",` +
	`"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,` +
	`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":7},"user":null}`

// createdEvent is vLLM's first event of a stream, its lines ended by eol.
func createdEvent(id, eol string) string {
	return `event: response.created` + eol +
		`data: {"response":{"id":"` + id + `","created_at":1750000000,"instructions":"be brief","model":"m",` +
		`"object":"response","output":[],"tools":[{"type":"function","name":"f","parameters":{"id":"no"}}],` +
		`"status":"in_progress","usage":null},"sequence_number":0,"type":"response.created"}` + eol + eol +
		`event: response.in_progress` + eol +
		`data: {"response":{"id":"` + id + `"},"sequence_number":1,"type":"response.in_progress"}` + eol + eol
}

func TestResponseIDReaderWholeBodies(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"vLLM's response", vllmResponse, "resp_0b5f"},
		{"the id after the output, whose items have ids",
			`{"object":"response","output":[{"id":"msg_1","type":"message"},{"id":"fc_2","type":"function_call"}],"id":"resp_last"}`,
			"resp_last"},
		{"leading whitespace", " \r\n\t" + `{"id":"resp_1"}`, "resp_1"},
		{"whitespace between the tokens", `{ "object" : "response" , "id" : "resp_1" }`, "resp_1"},
		{"an escaped key", `{"\u0069d":"resp_1"}`, "resp_1"},
		{"escapes in the id", `{"id":"resp_\u00e9\ud83d\ude00\/x"}`, "resp_é😀/x"},
		{"raw UTF-8 in the id", `{"id":"resp_é😀"}`, "resp_é😀"},
		{"an id of MaxResponseIDBytes", `{"id":"` + strings.Repeat("r", MaxResponseIDBytes) + `"}`, strings.Repeat("r", MaxResponseIDBytes)},
		{"an id of MaxResponseIDBytes written as escapes", `{"id":"` + strings.Repeat(`\u0072`, MaxResponseIDBytes) + `"}`,
			strings.Repeat("r", MaxResponseIDBytes)},
		{"the first id counts", `{"id":"resp_a","id":"resp_b"}`, "resp_a"},
		{"a key that quotes id in a string value", `{"text":"{\"id\":\"fake\"}","id":"real"}`, "real"},
		{"keys that start like id", `{"i":1,"idx":"no","ids":["no"],"id":"yes"}`, "yes"},
		{"a nested id is not taken", `{"output":[{"id":"msg_1"}],"response":{"id":"resp_1"},"object":"response"}`, ""},
		{"an error body", `{"error":{"message":"Response with id 'resp_x' not found.","type":"NotFoundError","param":null,"code":404}}`, ""},
		{"vLLM's older error body", `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, ""},
		{"a usage-only body", `{"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}`, ""},
		{"an empty object", `{}`, ""},
		{"an empty id", `{"id":""}`, ""},
		{"an id over MaxResponseIDBytes", `{"id":"` + strings.Repeat("r", MaxResponseIDBytes+1) + `"}`, ""},
		{"an id with an escaped newline", `{"id":"resp\n1"}`, ""},
		{"an id with an escaped control character", `{"id":"resp\u00071"}`, ""},
		{"an id with a C1 control character", `{"id":"resp\u00851"}`, ""},
		{"an id with DEL", "{\"id\":\"resp\x7f1\"}", ""},
		{"an id with a raw control character", "{\"id\":\"resp\x011\"}", ""},
		{"a raw control character in another string", "{\"text\":\"a\tb\",\"id\":\"resp_1\"}", ""},
		{"an id with invalid UTF-8", "{\"id\":\"resp\xff\"}", ""},
		{"an id with a lone high surrogate", `{"id":"resp\ud800"}`, ""},
		{"an id with a lone low surrogate", `{"id":"resp\udc00x"}`, ""},
		{"an id with a high surrogate before a letter", `{"id":"resp\ud800\u0041"}`, ""},
		{"an id with a bad escape", `{"id":"resp\x"}`, ""},
		{"an id with a bad \\u escape", `{"id":"resp\u00g1"}`, ""},
		{"a number id", `{"id":5}`, ""},
		{"a null id", `{"id":null,"object":"response"}`, ""},
		{"an object id", `{"id":{"id":"resp_1"}}`, ""},
		{"an array id", `{"id":["resp_1"]}`, ""},
		{"broken before the id", `{"output":[}],"id":"resp_1"}`, ""},
		{"a key without its colon", `{"object" "id":"resp_1"}`, ""},
		{"a missing comma", `{"object":"x" "id":"resp_1"}`, ""},
		{"an unquoted key", `{id:"resp_1"}`, ""},
		{"a bare value after the body", `{"object":"x"} {"id":"resp_1"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireSameEverySplit(t, []byte(tt.body), tt.want, true)
		})
	}
}

func TestResponseIDReaderEventStreams(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"vLLM's stream", createdEvent("resp_1", "\n"), "resp_1"},
		{"CRLF lines", createdEvent("resp_1", "\r\n"), "resp_1"},
		{"CR lines", createdEvent("resp_1", "\r"), "resp_1"},
		{"a UTF-8 id in CRLF lines", createdEvent("resp_é😀", "\r\n"), "resp_é😀"},
		{"a leading comment", ": keep-alive\n\n" + createdEvent("resp_1", "\n"), "resp_1"},
		{"a comment inside the event", "event: response.created\n: hi\ndata: {\"response\":{\"id\":\"resp_1\"},\"type\":\"response.created\"}\n\n", "resp_1"},
		{"leading blank lines", "\n\r\n\n" + createdEvent("resp_1", "\n"), "resp_1"},
		{"id and retry fields", "id: 7\nretry: 1000\n" + createdEvent("resp_1", "\n"), "resp_1"},
		{"data split over lines",
			"event: response.created\ndata: {\"response\":\ndata: {\"id\":\"resp_2\"},\ndata: \"type\":\"response.created\"}\n\n",
			"resp_2"},
		{"data lines with CRLF",
			"data: {\"response\":\r\ndata:{\"id\":\"resp_2\"},\r\ndata:\"type\"\r\ndata::\"response.created\"}\r\n\r\n",
			"resp_2"},
		{"no space after the colon", `data:{"response":{"id":"resp_3"},"type":"response.created"}` + "\n\n", "resp_3"},
		{"two spaces after the colon", `data:  {"response":{"id":"resp_3"},"type":"response.created"}` + "\n\n", "resp_3"},
		{"no type", `data: {"response":{"id":"resp_4"},"sequence_number":0}` + "\n\n", "resp_4"},
		{"the type first", `data: {"type":"response.created","response":{"id":"resp_5"`, "resp_5"},
		{"no blank line after the event's JSON", `data: {"response":{"id":"resp_6"},"type":"response.created"}`, "resp_6"},
		{"the response's nested ids are not taken",
			`data: {"response":{"output":[{"id":"msg_1"}],"tools":[{"id":"t"}],"id":"resp_7"},"id":"top","type":"response.created"}` + "\n\n",
			"resp_7"},
		{"another field named like data", "datum: {\"response\":{\"id\":\"no\"}}\n" + `data: {"response":{"id":"resp_8"}}` + "\n\n", "resp_8"},
		{"a data field with a leading space is another field", ` data: {"response":{"id":"no"}}` + "\n\n" + `data: {"response":{"id":"resp_9"}}` + "\n\n", "resp_9"},
		{"the first response counts", `data: {"response":{"id":"resp_a","id":"resp_b"},"response":{"id":"resp_c"}}` + "\n\n", "resp_a"},
		{"the first data event is not response.created",
			`data: {"type":"response.output_text.delta","delta":"x"}` + "\n\n" + createdEvent("resp_1", "\n"), ""},
		{"an error event", "event: error\ndata: {\"type\":\"error\",\"code\":\"x\",\"message\":\"y\"}\n\n" + createdEvent("resp_1", "\n"), ""},
		{"a response.completed event first", `data: {"response":{"id":"resp_1"},"type":"response.completed"}` + "\n\n", ""},
		{"a type that is no string", `data: {"response":{"id":"resp_1"},"type":1}` + "\n\n", ""},
		{"a response without an id", `data: {"response":{"status":"in_progress"},"type":"response.created"}` + "\n\n", ""},
		{"a response without an id is known at its end", `data: {"response":{"status":"in_progress"},"sequence_number":0`, ""},
		{"a response that is no object", `data: {"response":"resp_1","type":"response.created"}` + "\n\n", ""},
		{"a top-level id in place of the response's", `data: {"id":"resp_1","type":"response.created"}` + "\n\n", ""},
		{"a bad id", `data: {"response":{"id":"resp\u0000"},"type":"response.created"}` + "\n\n", ""},
		{"an id over MaxResponseIDBytes", `data: {"response":{"id":"` + strings.Repeat("r", MaxResponseIDBytes+1) + `"},"type":"response.created"}` + "\n\n", ""},
		{"data that is no JSON", "data: [DONE]\n\n", ""},
		{"data that is no object", "data: \"resp_1\"\n\n", ""},
		{"empty data", "data:\n\n" + createdEvent("resp_1", "\n"), ""},
		{"a data field without a colon", "data\n\n" + createdEvent("resp_1", "\n"), ""},
		{"an event that ends before its JSON does", `data: {"response":{"id":"resp_1"}` + "\n\n" + createdEvent("resp_2", "\n"), ""},
		{"a newline joining data lines inside a string", "data: {\"response\":{\"id\":\"resp\ndata: _1\"}}\n\n", ""},
		{"text after the event's JSON is not read", `data: {"response":{"id":"resp_1"}} trailing` + "\n\n", "resp_1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireSameEverySplit(t, []byte(tt.body), tt.want, true)
		})
	}
}

func TestResponseIDReaderWaitsForMore(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"nothing yet", ""},
		{"whitespace", " \n "},
		{"a whole body cut inside its id", `{"object":"response","id":"resp_1`},
		{"a whole body cut inside an escape", `{"id":"resp_\u00`},
		{"a whole body without an id yet", `{"object":"response","output":[{"id":"msg_1"}]`},
		{"events without data", ": hi\n\nevent: response.created\nid: 1\n\n"},
		{"a first event cut short", "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\"},\"sequence_number\":0"},
		{"a first event waiting for its type", "data: {\"response\":{\"id\":\"resp_1\"},\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireSameEverySplit(t, []byte(tt.body), "", false)
		})
	}
}

// TestResponseIDReaderScanBound pins MaxResponseIDScan: an id the first
// MaxResponseIDScan bytes of the body do not hold is not found, and the reader keeps
// next to nothing of what it scans.
func TestResponseIDReaderScanBound(t *testing.T) {
	const far = 100 << 10
	// pad makes a whole body whose id string closes at byte end-1 of the body.
	idAt := func(end int) string {
		tail := `","id":"resp_1"}`
		head := `{"pad":"`
		return head + strings.Repeat("a", end-len(head)-len(tail)+1) + tail
	}
	var hugeTools strings.Builder
	for i := 0; hugeTools.Len() < far; i++ {
		fmt.Fprintf(&hugeTools, `{"type":"function","name":"f%d","parameters":{"type":"object","properties":{"id":{"type":"string"}}}},`, i)
	}
	tools := strings.TrimSuffix(hugeTools.String(), ",")
	tests := []struct {
		name string
		body string
		want string
	}{
		{"whitespace before the body", strings.Repeat(" ", far) + `{"id":"resp_1"}`, ""},
		{"other members before the id", `{` + strings.Repeat(`"k":0,`, far/6) + `"id":"resp_1"}`, ""},
		{"a long string before the id", `{"instructions":"` + strings.Repeat("x", far) + `","id":"resp_1"}`, ""},
		{"deep nesting before the id", `{"x":` + strings.Repeat("[", far) + strings.Repeat("]", far) + `,"id":"resp_1"}`, ""},
		{"the id ending on the bound's last byte", idAt(MaxResponseIDScan), "resp_1"},
		{"the id ending a byte past the bound", idAt(MaxResponseIDScan + 1), ""},
		{"comments before the first event", strings.Repeat(": keep-alive\n", far/13) + createdEvent("resp_1", "\n"), ""},
		{"an event whose type lies past the bound gives the id read before it",
			`data: {"response":{"id":"resp_1","tools":[` + tools + `]},"sequence_number":0,"type":"response.created"}` + "\n\n", "resp_1"},
		{"an event whose response id lies past the bound",
			`data: {"response":{"tools":[` + tools + `],"id":"resp_1"},"sequence_number":0,"type":"response.created"}` + "\n\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			requireSameEverySplit(t, []byte(tt.body), tt.want, true)
		})
	}
}

func TestResponseIDReaderRetainsLittle(t *testing.T) {
	// The deepest nesting the bound allows costs a bit per level; the longest id, its
	// bytes.
	body := []byte(`{"x":` + strings.Repeat("[", MaxResponseIDScan))
	var r ResponseIDReader
	_, done := r.Write(body[:MaxResponseIDScan-1])
	require.False(t, done)
	assert.LessOrEqual(t, r.retained(), MaxResponseIDScan/4)

	r = ResponseIDReader{}
	body = []byte(`{"id":"` + strings.Repeat("r", MaxResponseIDBytes))
	_, done = r.Write(body)
	require.False(t, done)
	assert.LessOrEqual(t, r.retained(), 2*MaxResponseIDBytes)
}

func TestResponseIDReaderIsDoneForGood(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"found", `{"id":"resp_1"}`, "resp_1"},
		{"not found", `{"error":{}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r ResponseIDReader
			id, done := r.Write([]byte(tt.body))
			require.True(t, done)
			require.Equal(t, tt.want, id)
			read := r.read
			for _, more := range []string{`,"id":"resp_2"}`, "data: x\n\n", "\x00\xff"} {
				id, done = r.Write([]byte(more))
				assert.True(t, done)
				assert.Equal(t, tt.want, id)
			}
			assert.Equal(t, read, r.read, "a done reader reads nothing more")
			assert.Zero(t, r.retained(), "a done reader holds nothing")
		})
	}
}

func BenchmarkResponseIDReader(b *testing.B) {
	var tools strings.Builder
	for i := 0; tools.Len() < 80<<10; i++ {
		fmt.Fprintf(&tools, `{"type":"function","name":"f%d","description":"does a thing","parameters":{"type":"object","properties":{"id":{"type":"string"}}}},`, i)
	}
	bodies := []struct {
		name string
		body []byte
	}{
		{"whole", []byte(vllmResponse)},
		{"stream", []byte(createdEvent("resp_1", "\n"))},
		{"stream with 80 KiB of tools", []byte(`data: {"response":{"id":"resp_1","tools":[` + strings.TrimSuffix(tools.String(), ",") + `]},"type":"response.created"}` + "\n\n")},
		// Many short data lines ended by CRs alone: each line's end is found without
		// scanning the rest of the chunk.
		{"stream of 64 KiB of CR lines", []byte(`data: {"response":{"id":"resp_1","x":[` + strings.Repeat("\rdata:1,", 8<<10) + "\rdata:1]},\rdata:\"type\":\"response.created\"}\r\r")},
	}
	for _, bb := range bodies {
		b.Run(bb.name, func(b *testing.B) {
			b.SetBytes(int64(min(len(bb.body), MaxResponseIDScan)))
			b.ReportAllocs()
			for b.Loop() {
				var r ResponseIDReader
				if _, done := r.Write(bb.body); !done {
					b.Fatal("not done")
				}
			}
		})
	}
}
