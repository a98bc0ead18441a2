package openai

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/builtin"
	"github.com/kvroute/kvroute/tokenize/template"
)

// compactJSON returns s as compact JSON, its keys in the order written.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	v, err := jsonv.Parse([]byte(s), 64)
	require.NoError(t, err, s)
	return string(v.AppendCompact(nil))
}

// valuesJSON returns values as a compact JSON array, "null" for nil.
func valuesJSON(values []jsonv.Value) string {
	if values == nil {
		return "null"
	}
	return string(jsonv.ArrayValue(values...).AppendCompact(nil))
}

// responsesChat converts body, which must be converted.
func responsesChat(t *testing.T, body string) *tokenize.Chat {
	t.Helper()
	chat, err := ResponsesChat([]byte(body), DefaultLimits())
	require.NoError(t, err, body)
	require.NotNil(t, chat)
	return chat
}

func TestResponsesChatConvertsTheInput(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		messages string
	}{
		{"a string input is one user message",
			`{"model":"m","input":"hi"}`,
			`[{"role":"user","content":"hi"}]`},
		{"an empty string input is an empty user message",
			`{"model":"m","input":""}`,
			`[{"role":"user","content":""}]`},
		{"instructions come first, as a system message",
			`{"input":"hi","instructions":"be brief","model":"m"}`,
			`[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`},
		{"empty or null instructions add nothing",
			`{"model":"m","instructions":"","input":[{"role":"user","content":"a"}],"instructions":null}`,
			`[{"role":"user","content":"a"}]`},
		{"instructions alone with an empty input list",
			`{"model":"m","instructions":"sys","input":[]}`,
			`[{"role":"system","content":"sys"}]`},
		{"a system input item next to instructions gives two system messages",
			`{"model":"m","instructions":"a","input":[{"role":"system","content":"b"},{"role":"user","content":"c"}]}`,
			`[{"role":"system","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"c"}]`},
		{"messages keep their role and content, short form or typed, other keys dropped",
			`{"model":"m","input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":"u","id":"msg_1","status":"completed"},{"role":"system","content":"s","name":"x"}]}`,
			`[{"role":"developer","content":"d"},{"role":"user","content":"u"},{"role":"system","content":"s"}]`},
		{"input_text and output_text parts are text parts, in order",
			`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"text":"b","type":"output_text","annotations":[]},{"type":"text","text":"c"}]}]}`,
			`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"text","text":"c"}]}]`},
		{"an empty parts list stays empty",
			`{"model":"m","input":[{"role":"user","content":[]}]}`,
			`[{"role":"user","content":[]}]`},
		{"an assistant message takes its first part's text alone",
			`{"model":"m","input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"first","annotations":[]},{"type":"output_text","text":"second","annotations":[]}]}]}`,
			`[{"role":"user","content":"q"},{"role":"assistant","content":"first"}]`},
		{"an assistant message's string content is kept",
			`{"model":"m","input":[{"role":"assistant","content":"hello"}]}`,
			`[{"role":"assistant","content":"hello"}]`},
		{"an assistant message without parts has empty content",
			`{"model":"m","input":[{"type":"message","role":"assistant","content":[]}]}`,
			`[{"role":"assistant","content":""}]`},
		{"an assistant message after one with content starts a new message",
			`{"model":"m","input":[{"role":"assistant","content":"a"},{"role":"assistant","content":[{"type":"output_text","text":"b"}]}]}`,
			`[{"role":"assistant","content":"a"},{"role":"assistant","content":"b"}]`},
		{"a function_call starts an assistant message of tool calls alone",
			`{"model":"m","input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"call_1","name":"ls","arguments":"{\"path\": \".\"}","id":"fc_1","status":"completed"}]}`,
			`[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"call_1","function":{"name":"ls","arguments":"{\"path\": \".\"}"},"type":"function"}]}]`},
		{"function calls join the previous assistant message's tool calls",
			`{"model":"m","input":[{"role":"assistant","content":"let me look"},{"type":"function_call","call_id":"c1","name":"a","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"b","arguments":"not json"}]}`,
			`[{"role":"assistant","content":"let me look","tool_calls":[{"id":"c1","function":{"name":"a","arguments":"{}"},"type":"function"},{"id":"c2","function":{"name":"b","arguments":"not json"},"type":"function"}]}]`},
		{"a namespaced function call is named namespace__name",
			`{"model":"m","input":[{"type":"function_call","call_id":"c1","name":"search","namespace":"crm","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"plain","namespace":"","arguments":"{}"}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"crm__search","arguments":"{}"},"type":"function"},{"id":"c2","function":{"name":"plain","arguments":"{}"},"type":"function"}]}]`},
		{"assistant content joins a previous assistant message that has none",
			`{"model":"m","input":[{"type":"function_call","call_id":"c1","name":"a","arguments":"{}"},{"role":"assistant","content":"done"}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"a","arguments":"{}"},"type":"function"}],"content":"done"}]`},
		{"a function_call_output becomes a tool message",
			`{"model":"m","input":[{"type":"function_call_output","call_id":"c1","output":"42","id":"fco_1","status":"completed"}]}`,
			`[{"role":"tool","content":"42","tool_call_id":"c1"}]`},
		{"a function_call_output's text parts are text parts",
			`{"model":"m","input":[{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`,
			`[{"role":"tool","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"tool_call_id":"c1"}]`},
		{"a tool message ends the assistant message: a later call starts another",
			`{"model":"m","input":[{"type":"function_call","call_id":"c1","name":"a","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"x"},{"type":"function_call","call_id":"c2","name":"b","arguments":"{}"}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"a","arguments":"{}"},"type":"function"}]},{"role":"tool","content":"x","tool_call_id":"c1"},{"role":"assistant","tool_calls":[{"id":"c2","function":{"name":"b","arguments":"{}"},"type":"function"}]}]`},
		{"reasoning takes its first content part's text",
			`{"model":"m","input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"think"},{"type":"reasoning_text","text":"more"}]}]}`,
			`[{"role":"assistant","reasoning":"think"}]`},
		{"reasoning without content takes its first summary part's text",
			`{"model":"m","input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"},{"type":"summary_text","text":"two"}],"content":null}]}`,
			`[{"role":"assistant","reasoning":"sum"}]`},
		{"reasoning with neither is empty",
			`{"model":"m","input":[{"type":"reasoning","id":"rs_1","summary":[],"content":[],"encrypted_content":null}]}`,
			`[{"role":"assistant","reasoning":""}]`},
		{"reasoning joins the previous assistant message that has none",
			`{"model":"m","input":[{"role":"assistant","content":"a"},{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"why"}]}]}`,
			`[{"role":"assistant","content":"a","reasoning":"why"}]`},
		{"reasoning after reasoning starts a new message",
			`{"model":"m","input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"one"}]},{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"two"}]}]}`,
			`[{"role":"assistant","reasoning":"one"},{"role":"assistant","reasoning":"two"}]`},
		{"an agent's turn: reasoning, message and calls make one assistant message",
			`{"model":"m","instructions":"You are a coding agent.","input":[` +
				`{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the test"}]},` +
				`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"look first"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},` +
				`{"type":"function_call","call_id":"c1","name":"shell","arguments":"{\"cmd\":\"ls\"}"},` +
				`{"type":"function_call","call_id":"c2","name":"shell","arguments":"{\"cmd\":\"pwd\"}"},` +
				`{"type":"function_call_output","call_id":"c1","output":"a.go"},` +
				`{"type":"function_call_output","call_id":"c2","output":"/src"},` +
				`{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"edit"}]},` +
				`{"type":"function_call","call_id":"c3","name":"apply_patch","arguments":"{}"}]}`,
			`[{"role":"system","content":"You are a coding agent."},` +
				`{"role":"user","content":[{"type":"text","text":"fix the test"}]},` +
				`{"role":"assistant","reasoning":"look first","content":"Looking.","tool_calls":[` +
				`{"id":"c1","function":{"name":"shell","arguments":"{\"cmd\":\"ls\"}"},"type":"function"},` +
				`{"id":"c2","function":{"name":"shell","arguments":"{\"cmd\":\"pwd\"}"},"type":"function"}]},` +
				`{"role":"tool","content":"a.go","tool_call_id":"c1"},` +
				`{"role":"tool","content":"/src","tool_call_id":"c2"},` +
				`{"role":"assistant","reasoning":"edit","tool_calls":[{"id":"c3","function":{"name":"apply_patch","arguments":"{}"},"type":"function"}]}]`},
		{"a later duplicate input wins",
			`{"model":"m","input":"first","input":[{"role":"user","content":"second"}]}`,
			`[{"role":"user","content":"second"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := responsesChat(t, tt.body)
			assert.Equal(t, compactJSON(t, tt.messages), valuesJSON(chat.Messages))
			assert.True(t, chat.AddGenerationPrompt)
			assert.False(t, chat.ContinueFinalMessage)
			assert.Nil(t, chat.Unread)
		})
	}
}

func TestResponsesChatConvertsTheTools(t *testing.T) {
	const input = `"input":"hi"`
	tests := []struct {
		name  string
		tools string // the request's tools member ("" for none)
		want  string // the chat's Tools as JSON, "null" for nil
	}{
		{"no tools: nil", ``, `null`},
		{"null tools: nil", `"tools":null`, `null`},
		{"an empty list: nil", `"tools":[]`, `null`},
		{"a function tool: chat shape, nulls kept, strict after parameters",
			`"tools":[{"type":"function","name":"get","parameters":{"type":"object","properties":{"b":{},"a":{}}},"strict":true,"description":"Get it."}]`,
			`[{"type":"function","function":{"name":"get","description":"Get it.","parameters":{"type":"object","properties":{"b":{},"a":{}}},"strict":true}}]`},
		{"a bare function tool: description, parameters and strict are null",
			`"tools":[{"name":"f","type":"function"}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":null}}]`},
		{"strict is read as pydantic's lax bool",
			`"tools":[{"type":"function","name":"f","strict":"yes"},{"type":"function","name":"g","strict":0}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":true}},` +
				`{"type":"function","function":{"name":"g","description":null,"parameters":null,"strict":false}}]`},
		{"keys the SDK does not declare follow, in request order",
			`"tools":[{"zeta":1,"type":"function","name":"f","alpha":[2]}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":null,"zeta":1,"alpha":[2]}}]`},
		{"a namespace's function tools, named namespace__name, defer_loading (when set) before strict",
			`"tools":[{"type":"namespace","name":"crm","description":"CRM tools","tools":[` +
				`{"type":"function","name":"find","description":"Find.","parameters":{"type":"object"},"strict":false},` +
				`{"type":"custom","name":"raw"},` +
				`{"type":"function","name":"add","defer_loading":true}]}]`,
			`[{"type":"function","function":{"name":"crm__find","description":"Find.","parameters":{"type":"object"},"strict":false}},` +
				`{"type":"function","function":{"name":"crm__add","description":null,"parameters":null,"defer_loading":true,"strict":null}}]`},
		{"other tool types add nothing",
			`"tools":[{"type":"web_search_preview"},{"type":"function","name":"f"},{"type":"mcp","server_label":"x","server_url":"http://x"}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":null}}]`},
		{"tools none of which is a function: an empty list, as vLLM's",
			`"tools":[{"type":"web_search_preview"},{"type":"code_interpreter","container":{"type":"auto"}}]`,
			`[]`},
		{"functions and namespaces in request order",
			`"tools":[{"type":"function","name":"a"},{"type":"namespace","name":"n","description":"","tools":[{"type":"function","name":"b"}]},{"type":"function","name":"c"}]`,
			`[{"type":"function","function":{"name":"a","description":null,"parameters":null,"strict":null}},` +
				`{"type":"function","function":{"name":"n__b","description":null,"parameters":null,"strict":null}},` +
				`{"type":"function","function":{"name":"c","description":null,"parameters":null,"strict":null}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m",` + input
			if tt.tools != "" {
				body += "," + tt.tools
			}
			chat := responsesChat(t, body+"}")
			assert.Equal(t, compactJSON(t, tt.want), valuesJSON(chat.Tools))
		})
	}
}

func TestResponsesChatSetsTheTemplateKwargs(t *testing.T) {
	const user = `{"role":"user","content":"q"}`
	tests := []struct {
		name   string
		body   string
		cont   bool
		kwargs string // "" for none
	}{
		{"a plain request opens the assistant turn", `{"model":"m","input":"hi"}`, false, ""},
		{"a list ending in a completed assistant message does too",
			`{"model":"m","input":[` + user + `,{"type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"a"}]}]}`, false, ""},
		{"an in_progress output message is continued",
			`{"model":"m","input":[` + user + `,{"type":"message","role":"assistant","id":"msg_1","status":"in_progress","content":[{"type":"output_text","text":"The answer is"}]}]}`, true, ""},
		{"an incomplete output message is continued",
			`{"model":"m","input":[` + user + `,{"type":"message","role":"assistant","id":"msg_1","status":"incomplete","content":[]}]}`, true, ""},
		{"a short-form assistant message is not",
			`{"model":"m","input":[` + user + `,{"role":"assistant","id":"msg_1","status":"incomplete","content":"The answer is"}]}`, false, ""},
		{"an in_progress reasoning item is continued",
			`{"model":"m","input":[` + user + `,{"type":"reasoning","id":"r","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}],"status":"in_progress"}]}`, true, ""},
		{"an in_progress user message of parts is continued (a Message keeps its status)",
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"q"}],"status":"in_progress"}]}`, true, ""},
		{"an in_progress user message of a string is not",
			`{"model":"m","input":[{"role":"user","content":"q","status":"in_progress"}]}`, false, ""},
		{"only the last item counts",
			`{"model":"m","input":[{"type":"message","role":"assistant","id":"msg_1","status":"in_progress","content":[]},` + user + `]}`, false, ""},
		{"an in_progress function call is not continued",
			`{"model":"m","input":[` + user + `,{"type":"function_call","call_id":"c","name":"f","arguments":"{}","status":"in_progress"}]}`, false, ""},
		{"reasoning.effort becomes reasoning_effort, and turns thinking on",
			`{"model":"m","input":"hi","reasoning":{"effort":"high","summary":"auto"}}`, false, `{"reasoning_effort":"high","enable_thinking":true}`},
		{"a null effort is unset", `{"model":"m","input":"hi","reasoning":{"effort":null}}`, false, ""},
		{"null reasoning is unset", `{"model":"m","input":"hi","reasoning":null}`, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := responsesChat(t, tt.body)
			assert.Equal(t, tt.cont, chat.ContinueFinalMessage)
			assert.Equal(t, !tt.cont, chat.AddGenerationPrompt)
			if tt.kwargs == "" {
				assert.True(t, chat.TemplateKwargs.IsNull(), "kwargs %s", chat.TemplateKwargs.AppendCompact(nil))
				return
			}
			assert.Equal(t, compactJSON(t, tt.kwargs), string(chat.TemplateKwargs.AppendCompact(nil)))
		})
	}
}

func TestResponsesChatDoesNotRender(t *testing.T) {
	const user = `{"role":"user","content":"q"}`
	tests := []struct {
		name string
		body string
	}{
		{"a previous_response_id: the prompt is the stored conversation", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`},
		{"an empty previous_response_id", `{"model":"m","input":"hi","previous_response_id":""}`},
		{"a previous_response", `{"model":"m","input":"hi","previous_response":{"id":"resp_1","output":[]}}`},
		{"no input", `{"model":"m","instructions":"x"}`},
		{"a null input", `{"model":"m","input":null}`},
		{"an input that is an object", `{"model":"m","input":{"role":"user","content":"q"}}`},
		{"an empty input list and no instructions", `{"model":"m","input":[]}`},
		{"instructions that are no string", `{"model":"m","input":"hi","instructions":["x"]}`},
		{"an item that is no object", `{"model":"m","input":["hi"]}`},
		{"an item_reference", `{"model":"m","input":[` + user + `,{"type":"item_reference","id":"msg_1"}]}`},
		{"a computer_call", `{"model":"m","input":[{"type":"computer_call","call_id":"c","action":{}}]}`},
		{"an item of no known type", `{"model":"m","input":[{"type":"frobnicate","role":"user","content":"x"}]}`},
		{"an item whose type is no string", `{"model":"m","input":[{"type":1,"role":"user","content":"x"}]}`},
		{"an item with neither type nor role", `{"model":"m","input":[{"content":"x"}]}`},
		{"a message of role tool", `{"model":"m","input":[{"role":"tool","content":"x"}]}`},
		{"a message whose role is no string", `{"model":"m","input":[{"role":7,"content":"x"}]}`},
		{"a message without content", `{"model":"m","input":[{"role":"user"}]}`},
		{"an image part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"see"},{"type":"input_image","image_url":"data:x"}]}]}`},
		{"a file part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`},
		{"a string part", `{"model":"m","input":[{"role":"user","content":["x"]}]}`},
		{"a text part whose text is no string", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`},
		{"an assistant message whose first part is a refusal", `{"model":"m","input":[{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`},
		{"an assistant message with null content", `{"model":"m","input":[{"role":"assistant","content":null}]}`},
		{"a function_call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`},
		{"a function_call whose arguments are an object", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]}`},
		{"a function_call of an unknown status", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}","status":"done"}]}`},
		{"a function_call_output without output", `{"model":"m","input":[{"type":"function_call_output","call_id":"c"}]}`},
		{"a function_call_output with an image", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image","image_url":"x"}]}]}`},
		{"encrypted reasoning", `{"model":"m","input":[{"type":"reasoning","id":"r","summary":[],"encrypted_content":"gAAAA"}]}`},
		{"reasoning without summary", `{"model":"m","input":[{"type":"reasoning","id":"r","content":[{"type":"reasoning_text","text":"x"}]}]}`},
		{"reasoning whose text is no string", `{"model":"m","input":[{"type":"reasoning","id":"r","summary":[{"type":"summary_text"}]}]}`},
		{"tools that are no list", `{"model":"m","input":"hi","tools":{"type":"function","name":"f"}}`},
		{"a tool without a type", `{"model":"m","input":"hi","tools":[{"name":"f"}]}`},
		{"a function tool without a name", `{"model":"m","input":"hi","tools":[{"type":"function","parameters":{}}]}`},
		{"a function tool whose parameters are a list", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","parameters":[]}]}`},
		{"a function tool whose description is no string", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","description":1}]}`},
		{"a function tool whose strict is no bool", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","strict":"maybe"}]}`},
		{"a namespace without tools", `{"model":"m","input":"hi","tools":[{"type":"namespace","name":"n","description":""}]}`},
		{"a namespace holding an unknown tool", `{"model":"m","input":"hi","tools":[{"type":"namespace","name":"n","description":"","tools":[{"type":"web_search"}]}]}`},
		{"reasoning that is no object", `{"model":"m","input":"hi","reasoning":"high"}`},
		{"an effort that is no string", `{"model":"m","input":"hi","reasoning":{"effort":3}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, err := ResponsesChat([]byte(tt.body), DefaultLimits())
			require.ErrorIs(t, err, ErrResponsesNotRendered)
			assert.NotErrorIs(t, err, ErrBadRequest, "routed by load, not refused")
			assert.Nil(t, chat)
			_, parseErr := ParseResponses([]byte(tt.body), DefaultLimits())
			assert.NoError(t, parseErr, "ParseResponses accepts the body")
		})
	}
}

// TestResponsesChatRejectsAsParseResponses pins that a body ParseResponses refuses gets
// the same *FieldError from ResponsesChat, whatever its input holds.
func TestResponsesChatRejectsAsParseResponses(t *testing.T) {
	deep := `{"model":"m","input":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	for _, body := range []string{``, ` `, `null`, `["m"]`, `{"model":`, `{"model":"m"} x`,
		`{"model":"m","input":[1,}`, deep, `{"input":"x"}`, `{"model":""}`, `{"model":["m"]}`,
		`{"model":"m","input":"hi","previous_response_id":1}`, `{"model":"m","previous_response_id":{"id":"resp_1"}}`,
		`{"model":"m","input":"hi","store":2}`, `{"model":"m","input":"hi","background":"maybe"}`,
		`{"model":"m","input":"hi","stream":[true]}`, `{"model":1,"input":[{"type":"item_reference","id":"x"}]}`,
		`{"model":"m","input":"x","store":"no","stream":{},"previous_response_id":[]}`, "{\"model\":\"\xff\",\"input\":\"x\"}",
	} {
		_, want := ParseResponses([]byte(body), DefaultLimits())
		require.Error(t, want, body)
		chat, err := ResponsesChat([]byte(body), DefaultLimits())
		assert.Nil(t, chat)
		var fe *FieldError
		require.ErrorAs(t, err, &fe, body)
		assert.Equal(t, want, err, body)
		assert.NotErrorIs(t, err, ErrResponsesNotRendered, body)
	}
}

// TestResponsesChatBoundsItsMemory pins that the input is read within Parse's value
// budget: a body of tiny values that would take more is not rendered (routed by load),
// and a real conversation is.
func TestResponsesChatBoundsItsMemory(t *testing.T) {
	tiny := `{"model":"m","input":[{"role":"user","content":"hi","x":[` + tinyValues(1<<20, "0") + `]}]}`
	_, err := ResponsesChat([]byte(tiny), DefaultLimits())
	require.ErrorIs(t, err, ErrResponsesNotRendered)
	assert.Contains(t, err.Error(), "bytes per byte of the request body")

	var b strings.Builder
	b.WriteString(`{"model":"m","input":[`)
	for i := range 2000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"message","role":"user","content":[{"type":"input_text","text":"` + strings.Repeat("word ", 40) + `"}]},` +
			`{"type":"function_call","call_id":"c","name":"shell","arguments":"{\"cmd\":\"ls -la\"}"},` +
			`{"type":"function_call_output","call_id":"c","output":"` + strings.Repeat("file ", 40) + `"}`)
	}
	b.WriteString(`]}`)
	chat, err := ResponsesChat([]byte(b.String()), DefaultLimits())
	require.NoError(t, err)
	assert.Len(t, chat.Messages, 6000)
}

// TestResponsesChatAllocatesInProportionToTheBody pins what the densest inputs cost:
// the values read (at most 4 bytes per byte of body, as Parse's) and the chat built
// from them (at most as much again, else the request is not rendered), at most about 8
// times the body in all.
func TestResponsesChatAllocatesInProportionToTheBody(t *testing.T) {
	inputOf := func(item string) string { return `"input":[` + tinyValues(1<<20, item) + `]` }
	tests := []struct {
		name    string
		members string
	}{
		{"short messages", inputOf(`{"role":"user","content":""}`)},
		{"typed messages", inputOf(`{"type":"message","role":"user","content":""}`)},
		{"assistant messages", inputOf(`{"role":"assistant","content":""}`)},
		{"function calls", inputOf(`{"type":"function_call","call_id":"","name":"","arguments":""}`)},
		{"namespaced function calls", inputOf(`{"type":"function_call","call_id":"","name":"","namespace":"n","arguments":""}`)},
		{"function call outputs", inputOf(`{"type":"function_call_output","call_id":"","output":""}`)},
		{"reasoning items", inputOf(`{"type":"reasoning","summary":[]}`)},
		{"text parts", `"input":[{"role":"user","content":[` + tinyValues(1<<20, `{"type":"input_text","text":""}`) + `]}]`},
		{"function tools", `"input":"x","tools":[` + tinyValues(1<<20, `{"type":"function","name":""}`) + `]`},
		{"namespaced function tools", `"input":"x","tools":[{"type":"namespace","name":"n","description":"","tools":[` +
			tinyValues(1<<20, `{"type":"function","name":""}`) + `]}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(`{"model":"m",` + tt.members + `}`)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			chat, err := ResponsesChat(body, DefaultLimits())
			runtime.ReadMemStats(&after)
			if err != nil {
				require.ErrorIs(t, err, ErrResponsesNotRendered)
			}
			runtime.KeepAlive(chat)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%.1f bytes per byte of body, rendered: %v", float64(allocated)/float64(len(body)), err == nil)
			assert.Less(t, allocated, uint64(9*len(body)))
		})
	}
}

// qwen3Renderer is the renderer of kvroute's embedded Qwen3 chat template.
func qwen3Renderer(t *testing.T) *template.Renderer {
	t.Helper()
	config, err := builtin.TokenizerConfigJSON("qwen3")
	require.NoError(t, err)
	r, err := template.FromConfig(config, template.Options{})
	require.NoError(t, err)
	return r
}

// TestResponsesChatRendersAsItsChatCompletionsTwin holds a Responses body's chat to the
// chat-completions request carrying the messages, tools and kwargs vLLM converts it into
// (RESPONSES_API.md §1.2d: both render through the same path): Qwen3's template, and
// ChatML, must render the two to the same prompt.
func TestResponsesChatRendersAsItsChatCompletionsTwin(t *testing.T) {
	const params = `{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}`
	tests := []struct {
		name      string
		responses string
		chat      string
		contains  string // a piece of the prompt that shows the feature rendered
	}{
		{"text turns with instructions",
			`{"model":"m","instructions":"Be brief.","input":[` +
				`{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi."},{"type":"input_text","text":"Who are you?"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"An assistant."}]},` +
				`{"role":"user","content":"Thanks."}]}`,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},` +
				`{"role":"user","content":[{"type":"text","text":"Hi."},{"type":"text","text":"Who are you?"}]},` +
				`{"role":"assistant","content":"An assistant."},{"role":"user","content":"Thanks."}]}`,
			"Hi.\nWho are you?"},
		{"an agent's turns with reasoning, tool calls, outputs and tools",
			`{"model":"m","instructions":"You are a coding agent.","store":false,"stream":true,"input":[` +
				`{"type":"message","role":"user","content":[{"type":"input_text","text":"Fix the test."}]},` +
				`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"List the files first."}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."}]},` +
				`{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"cmd\": \"ls\"}"},` +
				`{"type":"function_call","call_id":"call_2","name":"find","namespace":"repo","arguments":"{\"q\":\"test\"}"},` +
				`{"type":"function_call_output","call_id":"call_1","output":"a_test.go"},` +
				`{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"a_test.go:12"}]},` +
				`{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"Edit line 12."}]},` +
				`{"type":"function_call","call_id":"call_3","name":"shell","arguments":"{\"cmd\": \"sed -i 12d a_test.go\"}"},` +
				`{"type":"function_call_output","call_id":"call_3","output":""}],` +
				`"tools":[{"type":"function","name":"shell","description":"Run a command.","strict":false,"parameters":` + params + `},` +
				`{"type":"web_search_preview"},` +
				`{"type":"namespace","name":"repo","description":"Repository tools.","tools":[{"type":"function","name":"find","parameters":{"type":"object"}}]}],` +
				`"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"effort":"medium"}}`,
			`{"model":"m","messages":[{"role":"system","content":"You are a coding agent."},` +
				`{"role":"user","content":[{"type":"text","text":"Fix the test."}]},` +
				`{"role":"assistant","reasoning":"List the files first.","content":"Looking.","tool_calls":[` +
				`{"id":"call_1","function":{"name":"shell","arguments":"{\"cmd\": \"ls\"}"},"type":"function"},` +
				`{"id":"call_2","function":{"name":"repo__find","arguments":"{\"q\":\"test\"}"},"type":"function"}]},` +
				`{"role":"tool","content":"a_test.go","tool_call_id":"call_1"},` +
				`{"role":"tool","content":[{"type":"text","text":"a_test.go:12"}],"tool_call_id":"call_2"},` +
				`{"role":"assistant","reasoning":"Edit line 12.","tool_calls":[{"id":"call_3","function":{"name":"shell","arguments":"{\"cmd\": \"sed -i 12d a_test.go\"}"},"type":"function"}]},` +
				`{"role":"tool","content":"","tool_call_id":"call_3"}],` +
				`"tools":[{"type":"function","function":{"name":"shell","description":"Run a command.","parameters":` + params + `,"strict":false}},` +
				`{"type":"function","function":{"name":"repo__find","description":null,"parameters":{"type":"object"},"strict":null}}],` +
				`"chat_template_kwargs":{"reasoning_effort":"medium","enable_thinking":true}}`,
			`"name": "repo__find"`},
		{"a partial assistant message continued",
			`{"model":"m","input":[{"role":"user","content":"Count to three."},` +
				`{"type":"message","role":"assistant","id":"msg_1","status":"in_progress","content":[{"type":"output_text","text":"One, two,","annotations":[]}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":"Count to three."},{"role":"assistant","content":"One, two,"}],` +
				`"add_generation_prompt":false,"continue_final_message":true}`,
			"One, two,"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := responsesChat(t, tt.responses)
			twin, err := Parse(ChatCompletions, []byte(tt.chat), DefaultLimits())
			require.NoError(t, err)
			rendersAsTwin(t, got, twin.Chat, tt.contains)
		})
	}
}

// TestResponsesChatErrorsNameTheItem pins that an item's error says which item it is.
func TestResponsesChatErrorsNameTheItem(t *testing.T) {
	_, err := ResponsesChat([]byte(`{"model":"m","input":[{"role":"user","content":"a"},{"type":"item_reference","id":"x"}]}`), DefaultLimits())
	require.ErrorIs(t, err, ErrResponsesNotRendered)
	assert.Contains(t, err.Error(), "input[1]")
	assert.Contains(t, err.Error(), `"item_reference"`)
	assert.False(t, errors.Is(err, ErrBadRequest))
}

// TestResponsesChatToolsAsVLLMsFunctionDefinitionDumpsThem: vLLM renders a Responses
// function tool as ChatCompletionToolsParam(function=FunctionDefinition.model_validate(
// the SDK model's dump)).model_dump(). Every vLLM that takes namespace tools (PR #47024,
// July 2026) has FunctionDefinition declare defer_loading after parameters and drop it
// from the dump when null (PR #40190), and runs an openai package ≥ 2.25 (NamespaceTool):
// a namespace's function, as sent by Codex with every request, renders without a
// "defer_loading": null, and a defer_loading given comes right after parameters.
func TestResponsesChatToolsAsVLLMsFunctionDefinitionDumpsThem(t *testing.T) {
	tests := []struct {
		name  string
		tools string
		want  string
	}{
		{"a namespace's function without defer_loading: no defer_loading key",
			`[{"type":"namespace","name":"mcp__fs__","description":"Files.","tools":[` +
				`{"type":"function","name":"read","description":"Read a file.","strict":false,"parameters":{"type":"object"}}]}]`,
			`[{"type":"function","function":{"name":"mcp__fs____read","description":"Read a file.","parameters":{"type":"object"},"strict":false}}]`},
		{"a namespace's function with defer_loading: after parameters",
			`[{"type":"namespace","name":"crm","description":"","tools":[{"type":"function","name":"add","strict":true,"defer_loading":true}]}]`,
			`[{"type":"function","function":{"name":"crm__add","description":null,"parameters":null,"defer_loading":true,"strict":true}}]`},
		{"a function tool with defer_loading: after parameters, before strict",
			`[{"type":"function","name":"f","strict":false,"defer_loading":true,"x":1}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"defer_loading":true,"strict":false,"x":1}}]`},
		{"a function tool with defer_loading null: dropped",
			`[{"type":"function","name":"f","defer_loading":null}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":null,"strict":null}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := responsesChat(t, `{"model":"m","input":"hi","tools":`+tt.tools+`}`)
			assert.Equal(t, compactJSON(t, tt.want), valuesJSON(chat.Tools))
		})
	}
}

// TestResponsesChatKwargsAsTheLatestVLLM pins build_chat_params and input_item_parsing
// as vLLM's latest ResponsesRequest has them (docs.vllm.ai, latest, 2026-09-24, the
// protocol of the vLLM with namespace tools): the request's chat_template_kwargs are
// the kwargs under vLLM's own (add_generation_prompt and continue_final_message always
// win, reasoning_effort when set); reasoning.effort also sets enable_thinking (effort
// other than "none") unless the request's kwargs set it; a typed assistant message of
// parts becomes a ResponseOutputMessage (an id made up when it has none), so its
// in_progress status continues it. The kwargs are held to what a template reads.
func TestResponsesChatKwargsAsTheLatestVLLM(t *testing.T) {
	const user = `{"role":"user","content":"q"}`
	const src = `{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}-{% endif %}|` +
		`{% if reasoning_effort is defined %}{{ reasoning_effort }}{% else %}-{% endif %}|` +
		`{{ add_generation_prompt }}|{% if k is defined %}{{ k | tojson }}{% else %}-{% endif %}|` +
		`{% for m in messages %}{{ m.content }};{% endfor %}`
	r, err := template.New(src, template.Tokens{}, template.Options{})
	require.NoError(t, err)
	tests := []struct {
		name string
		body string
		cont bool
		want string // the render
	}{
		{"the request's kwargs are passed",
			`{"model":"m","input":"hi","chat_template_kwargs":{"enable_thinking":false,"k":[1]}}`, false, `False|-|True|[1]|hi;`},
		{"effort none turns thinking off",
			`{"model":"m","input":"hi","reasoning":{"effort":"none"}}`, false, `False|none|True|-|hi;`},
		{"another effort turns it on",
			`{"model":"m","input":"hi","reasoning":{"effort":"medium","summary":"auto"}}`, false, `True|medium|True|-|hi;`},
		{"the request's enable_thinking is kept; its effort is overridden",
			`{"model":"m","input":"hi","reasoning":{"effort":"low"},"chat_template_kwargs":{"enable_thinking":false,"reasoning_effort":"x"}}`, false,
			`False|low|True|-|hi;`},
		{"the request's generation flags are overridden",
			`{"model":"m","input":"hi","chat_template_kwargs":{"add_generation_prompt":false,"continue_final_message":true,"k":1}}`, false, `-|-|True|1|hi;`},
		{"a typed assistant message of parts without an id is continued",
			`{"model":"m","input":[` + user + `,{"type":"message","role":"assistant","status":"in_progress","content":[{"type":"output_text","text":"a"}]}]}`, true,
			`-|-|False|-|q;a`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := responsesChat(t, tt.body)
			assert.Equal(t, tt.cont, chat.ContinueFinalMessage)
			assert.Equal(t, !tt.cont, chat.AddGenerationPrompt)
			got, err := r.Render(chat)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// rendersAsTwin checks that a rebuilt chat renders to its chat-completions twin's
// prompt on the embedded Qwen3 template and on ChatML, and that Qwen3's holds contains.
func rendersAsTwin(t *testing.T, got, twin *tokenize.Chat, contains string) {
	t.Helper()
	qwen3 := qwen3Renderer(t)
	for _, r := range []struct {
		name     string
		renderer tokenize.ChatRenderer
	}{{"qwen3", qwen3}, {"chatml", tokenize.ChatML{}}} {
		want, err := r.renderer.Render(twin)
		require.NoError(t, err, r.name)
		prompt, err := r.renderer.Render(got)
		require.NoError(t, err, r.name)
		assert.Equal(t, want, prompt, r.name)
		if r.name == "qwen3" {
			assert.Contains(t, prompt, contains)
		}
	}
}
