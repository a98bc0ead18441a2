package openai

import (
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// messagesChat converts body, which must be converted.
func messagesChat(t *testing.T, body string) *tokenize.Chat {
	t.Helper()
	chat, err := MessagesChat([]byte(body), DefaultLimits())
	require.NoError(t, err, body)
	require.NotNil(t, chat)
	return chat
}

func TestParseMessagesReadsTheRoutingFields(t *testing.T) {
	tests := []struct {
		name string
		body string
		want MessagesRequest
	}{
		{"model alone", `{"model":"m"}`, MessagesRequest{Model: "m"}},
		{"every field", `{"model":"m","stream":true,"cache_salt":"s","max_tokens":1024,"messages":[{"role":"user","content":"x"}]}`,
			MessagesRequest{Model: "m", Stream: true, CacheSalt: "s", MaxTokens: 1024}},
		{"lax values as pydantic reads them", `{"model":"m","stream":"yes","max_tokens":"2_048"}`, MessagesRequest{Model: "m", Stream: true, MaxTokens: 2048}},
		{"nulls are unset", `{"model":"m","stream":null,"cache_salt":null,"max_tokens":null}`, MessagesRequest{Model: "m"}},
		{"a later duplicate wins", `{"model":"a","model":"b","stream":true,"stream":false}`, MessagesRequest{Model: "b"}},
		{"other fields are not judged", `{"model":"m","messages":7,"system":{},"tools":"x"}`, MessagesRequest{Model: "m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMessages([]byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseMessagesRefusesAsParse(t *testing.T) {
	tests := []struct{ body, param string }{
		{``, ""}, {`[]`, ""}, {`{"model":"m"`, ""}, {`{}`, "model"}, {`{"model":""}`, "model"}, {`{"model":["m"]}`, "model"},
		{`{"model":"m","stream":2}`, "stream"}, {`{"model":"m","cache_salt":1}`, "cache_salt"},
		{`{"model":"m","max_tokens":-1}`, "max_tokens"}, {`{"model":"m","max_tokens":1.5}`, "max_tokens"},
	}
	for _, tt := range tests {
		_, err := ParseMessages([]byte(tt.body), DefaultLimits())
		var fe *FieldError
		require.ErrorAs(t, err, &fe, tt.body)
		assert.Equal(t, tt.param, fe.Param, tt.body)
		assert.ErrorIs(t, err, ErrBadRequest)
	}
	// The body's and the model's errors are Parse's.
	for _, body := range []string{``, `[]`, `{"model":""}`} {
		_, want := Parse(ChatCompletions, []byte(body), DefaultLimits())
		_, err := ParseMessages([]byte(body), DefaultLimits())
		assert.Equal(t, want, err, body)
	}
}

func TestMessagesChatConvertsTheMessages(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		messages string
	}{
		{"string content is kept",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":""}]}`,
			`[{"role":"user","content":"hi"},{"role":"assistant","content":""}]`},
		{"a system string is the leading system message, a billing header kept",
			`{"model":"m","system":"x-anthropic-billing-header: a","messages":[{"role":"user","content":"q"}]}`,
			`[{"role":"system","content":"x-anthropic-billing-header: a"},{"role":"user","content":"q"}]`},
		{"system blocks are joined with no separator, billing header and empty blocks dropped",
			`{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1"},{"type":"text","text":"A."},{"type":"text","text":""},{"type":"text","text":" B.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"q"}]}`,
			`[{"role":"system","content":"A. B."},{"role":"user","content":"q"}]`},
		{"an empty system adds nothing",
			`{"model":"m","system":"","messages":[{"role":"user","content":"q"}]}`,
			`[{"role":"user","content":"q"}]`},
		{"a system of the billing header alone adds nothing",
			`{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: x"}],"messages":[{"role":"user","content":"q"}]}`,
			`[{"role":"user","content":"q"}]`},
		{"leading system messages join the system prompt with blank lines",
			`{"model":"m","system":"S","messages":[{"role":"system","content":"A"},{"role":"system","content":[{"type":"text","text":"B"}]},{"role":"system","content":"x-anthropic-billing-header: z"},{"role":"user","content":"q"}]}`,
			`[{"role":"system","content":"S\n\nA\n\nB"},{"role":"user","content":"q"}]`},
		{"a later system message without text is dropped",
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"system","content":"x-anthropic-billing-header: z"},{"role":"system","content":[]}]}`,
			`[{"role":"user","content":"q"}]`},
		{"text blocks are text parts; one collapses to a string",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":null}]},{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`,
			`[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]`},
		{"a user message of no text is dropped",
			`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":[]},{"role":"user","content":[{"type":"text","text":""},{"type":"image","source":{}}]}]}`,
			`[{"role":"user","content":"a"}]`},
		{"an assistant message of nothing is kept, without content",
			`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"redacted_thinking","data":"xx"}]}]}`,
			`[{"role":"user","content":"a"},{"role":"assistant"}]`},
		{"thinking blocks are joined as reasoning, an empty one counts",
			`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"},{"type":"text","text":"t"},{"type":"thinking","thinking":"y"},{"type":"thinking","thinking":null}]},{"role":"assistant","content":[{"type":"thinking","thinking":""}]}]}`,
			`[{"role":"user","content":"a"},{"role":"assistant","reasoning":"xy","content":"t"},{"role":"assistant","reasoning":""}]`},
		{"tool_use blocks are tool calls, arguments json.dumps of the input",
			`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"Looking."},{"type":"tool_use","id":"t1","name":"ls","input":{"path":"é/\u007f","n":1.50,"z":-0,"deep":{"a":[1e2,true,null]}}},{"type":"tool_use","id":"t2","name":"pwd","input":{}},{"type":"tool_use","id":"t3","input":null}]}]}`,
			`[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[` +
				`{"id":"t1","type":"function","function":{"name":"ls","arguments":"{\"path\": \"\\u00e9/\\u007f\", \"n\": 1.5, \"z\": 0, \"deep\": {\"a\": [100.0, true, null]}}"}},` +
				`{"id":"t2","type":"function","function":{"name":"pwd","arguments":"{}"}},` +
				`{"id":"t3","type":"function","function":{"name":"","arguments":"{}"}}],"content":"Looking."}]`},
		{"tool results come before the rest of their user message",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"after"},{"type":"tool_result","tool_use_id":"t1","content":"one"},{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}]}`,
			`[{"role":"tool","tool_call_id":"t1","content":"one"},{"role":"tool","tool_call_id":"t2","content":"a\nb"},{"role":"user","content":"after"}]`},
		{"a tool result's content: null, empty, items without text or of other types",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"},{"type":"tool_result","content":[]},{"type":"tool_result","tool_use_id":"t3","content":[{"type":"text"},{"type":"document","source":{}},{"type":"text","text":"x"},{"type":"tool_reference"},{"type":"image","source":{"type":"url","url":""}}]}]}]}`,
			`[{"role":"tool","tool_call_id":"t1","content":""},{"role":"tool","tool_call_id":"","content":""},{"role":"tool","tool_call_id":"t3","content":"\nx"}]`},
		{"a tool result in an assistant message is a text part",
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":"42"},{"type":"tool_result","content":null}]}]}`,
			`[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"Tool result: 42"},{"type":"text","text":"Tool result: "}]}]`},
		{"tool_use in a user message is dropped with a message left without content",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":"q"}]}`,
			`[{"role":"user","content":"q"}]`},
		{"a final assistant message stays a message (vLLM does not continue it)",
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]}`,
			`[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]`},
		{"unknown keys are ignored",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","citations":null,"cache_control":{"type":"ephemeral"}}],"id":"x"}],"metadata":{"user_id":"u"},"top_k":5}`,
			`[{"role":"user","content":"a"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := messagesChat(t, tt.body)
			assert.Equal(t, compactJSON(t, tt.messages), valuesJSON(chat.Messages))
			assert.True(t, chat.AddGenerationPrompt)
			assert.False(t, chat.ContinueFinalMessage)
			assert.Nil(t, chat.Tools)
			assert.Nil(t, chat.Unread)
		})
	}
}

func TestMessagesChatConvertsTheTools(t *testing.T) {
	tests := []struct {
		name  string
		tools string
		want  string
	}{
		{"no tools: nil", `null`, `null`},
		{"an empty list: empty", `[]`, `[]`},
		{"a tool: function shape, strict null, description kept",
			`[{"name":"f","description":"F.","input_schema":{"type":"object","properties":{"b":{},"a":{}}},"cache_control":{"type":"ephemeral"}}]`,
			`[{"type":"function","function":{"name":"f","description":"F.","parameters":{"type":"object","properties":{"b":{},"a":{}}},"strict":null}}]`},
		{"an input_schema without type gets type object last",
			`[{"name":"f","input_schema":{"properties":{}}}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":{"properties":{},"type":"object"},"strict":null}}]`},
		{"a null type is a type",
			`[{"name":"f","input_schema":{"type":null}}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":null},"strict":null}}]`},
		{"strict and defer_loading as lax bools, defer_loading only when set, before strict",
			`[{"name":"f","input_schema":{"type":"object"},"strict":"yes","defer_loading":0},{"name":"g","input_schema":{"type":"object"},"defer_loading":null,"strict":false}]`,
			`[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"},"defer_loading":false,"strict":true}},` +
				`{"type":"function","function":{"name":"g","description":null,"parameters":{"type":"object"},"strict":false}}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := messagesChat(t, `{"model":"m","messages":[{"role":"user","content":"q"}],"tools":`+tt.tools+`}`)
			assert.Equal(t, compactJSON(t, tt.want), valuesJSON(chat.Tools))
		})
	}
}

func TestMessagesChatSetsTheKwargs(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"q"}]`
	tests := []struct {
		name   string
		body   string
		kwargs string // "" for none
	}{
		{"none", `{"model":"m",` + msgs + `}`, ""},
		{"output_config.effort is the reasoning effort, and turns thinking on",
			`{"model":"m",` + msgs + `,"output_config":{"effort":"max"}}`, `{"reasoning_effort":"max","enable_thinking":true}`},
		{"chat_template_kwargs pass, their enable_thinking kept",
			`{"model":"m",` + msgs + `,"output_config":{"effort":"low","format":null},"chat_template_kwargs":{"enable_thinking":false,"k":[1]}}`,
			`{"enable_thinking":false,"k":[1],"reasoning_effort":"low"}`},
		{"chat_template_kwargs alone", `{"model":"m",` + msgs + `,"chat_template_kwargs":{"k":1}}`, `{"k":1}`},
		{"thinking enabled or adaptive changes nothing",
			`{"model":"m",` + msgs + `,"thinking":{"type":"enabled","budget_tokens":2048},"max_tokens":4096}`, ""},
		{"a null output_config or effort is unset", `{"model":"m",` + msgs + `,"output_config":{"effort":null},"thinking":{"type":"adaptive"}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := messagesChat(t, tt.body)
			if tt.kwargs == "" {
				assert.True(t, chat.TemplateKwargs.IsNull(), "kwargs %s", chat.TemplateKwargs.AppendCompact(nil))
				return
			}
			assert.Equal(t, compactJSON(t, tt.kwargs), string(chat.TemplateKwargs.AppendCompact(nil)))
		})
	}
}

func TestMessagesChatDoesNotRender(t *testing.T) {
	const user = `{"role":"user","content":"q"}`
	tests := []struct {
		name string
		body string
	}{
		{"no messages", `{"model":"m","system":"s"}`},
		{"null messages", `{"model":"m","messages":null}`},
		{"messages that are no list", `{"model":"m","messages":{"role":"user","content":"q"}}`},
		{"an empty messages list and no system", `{"model":"m","messages":[]}`},
		{"only messages that are dropped", `{"model":"m","messages":[{"role":"user","content":[]}]}`},
		{"a message that is no object", `{"model":"m","messages":["q"]}`},
		{"a message of role tool", `{"model":"m","messages":[{"role":"tool","content":"q"}]}`},
		{"a message whose role is no string", `{"model":"m","messages":[{"role":1,"content":"q"}]}`},
		{"a message without content", `{"model":"m","messages":[{"role":"user"}]}`},
		{"a message with null content", `{"model":"m","messages":[{"role":"user","content":null}]}`},
		{"a block that is no object", `{"model":"m","messages":[{"role":"user","content":["q"]}]}`},
		{"a document block", `{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"x"}}]}]}`},
		{"a server_tool_use block", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]}]}`},
		{"a block without a type", `{"model":"m","messages":[{"role":"user","content":[{"text":"q"}]}]}`},
		{"a text that is no string", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`},
		{"a tool_use input that is a list", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}]}`},
		{"an is_error that is no bool", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","is_error":"maybe"}]}]}`},
		{"a tool_result content list of strings", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":["x"]}]}]}`},
		{"an image block", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`},
		{"an image in a tool result", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}}]}]}]}`},
		{"an image without source in a tool result", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]}]}]}`},
		{"a named tool reference in a tool result", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"tool_reference","tool_name":"f"}]}]}]}`},
		{"a tool result text that is null", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":null}]}]}]}`},
		{"a tool_use without id", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`},
		{"a tool_use with an empty id", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"","name":"f","input":{}}]}]}`},
		{"a tool_use input number beyond float64", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":1e400}}]}]}`},
		{"a tool_use input NaN", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":NaN}}]}]}`},
		{"a tool_use input -Infinity", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":[-Infinity]}}]}]}`},
		{"a tool_use input integer Python refuses", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"x":` + strings.Repeat("9", 4301) + `}}]}]}`},
		{"an assistant tool_result of blocks (Python repr)", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}]}`},
		{"a system that is no string or list", `{"model":"m","system":{"type":"text","text":"s"},"messages":[` + user + `]}`},
		{"a system block of an unknown type", `{"model":"m","system":[{"type":"document"}],"messages":[` + user + `]}`},
		{"thinking disabled (vLLM probes the template for its effort)", `{"model":"m","messages":[` + user + `],"thinking":{"type":"disabled"}}`},
		{"thinking of an unknown type", `{"model":"m","messages":[` + user + `],"thinking":{"type":"on"}}`},
		{"an unknown effort", `{"model":"m","messages":[` + user + `],"output_config":{"effort":"none"}}`},
		{"output_config that is no object", `{"model":"m","messages":[` + user + `],"output_config":"high"}`},
		{"chat_template_kwargs that are no object", `{"model":"m","messages":[` + user + `],"chat_template_kwargs":[]}`},
		{"tools that are no list", `{"model":"m","messages":[` + user + `],"tools":{}}`},
		{"a server tool (no input_schema)", `{"model":"m","messages":[` + user + `],"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5}]}`},
		{"a tool without name", `{"model":"m","messages":[` + user + `],"tools":[{"input_schema":{}}]}`},
		{"a tool whose input_schema is a list", `{"model":"m","messages":[` + user + `],"tools":[{"name":"f","input_schema":[]}]}`},
		{"a tool whose description is no string", `{"model":"m","messages":[` + user + `],"tools":[{"name":"f","description":1,"input_schema":{}}]}`},
		{"a tool whose strict is no bool", `{"model":"m","messages":[` + user + `],"tools":[{"name":"f","input_schema":{},"strict":"maybe"}]}`},
		{"a tool_choice tool without name", `{"model":"m","messages":[` + user + `],"tool_choice":{"type":"tool"}}`},
		{"a tool_choice of an unknown type", `{"model":"m","messages":[` + user + `],"tool_choice":{"type":"required"}}`},
		{"a tool_choice string", `{"model":"m","messages":[` + user + `],"tool_choice":"auto"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat, err := MessagesChat([]byte(tt.body), DefaultLimits())
			require.ErrorIs(t, err, ErrMessagesNotRendered)
			assert.NotErrorIs(t, err, ErrBadRequest, "routed by load, not refused")
			assert.Nil(t, chat)
			_, parseErr := ParseMessages([]byte(tt.body), DefaultLimits())
			assert.NoError(t, parseErr, "ParseMessages accepts the body")
		})
	}
}

// TestMessagesChatRejectsAsParseMessages pins that a body ParseMessages refuses gets
// the same *FieldError from MessagesChat, whatever its messages hold.
func TestMessagesChatRejectsAsParseMessages(t *testing.T) {
	deep := `{"model":"m","messages":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	for _, body := range []string{``, ` `, `null`, `["m"]`, `{"model":`, `{"model":"m"} x`,
		`{"model":"m","messages":[1,}`, deep, `{"messages":[]}`, `{"model":""}`, `{"model":["m"]}`,
		`{"model":"m","stream":[true]}`, `{"model":"m","cache_salt":{}}`, `{"model":"m","max_tokens":"many"}`,
		`{"model":1,"messages":[{"role":"tool"}]}`, "{\"model\":\"\xff\",\"messages\":[]}",
	} {
		_, want := ParseMessages([]byte(body), DefaultLimits())
		require.Error(t, want, body)
		chat, err := MessagesChat([]byte(body), DefaultLimits())
		assert.Nil(t, chat)
		var fe *FieldError
		require.ErrorAs(t, err, &fe, body)
		assert.Equal(t, want, err, body)
		assert.NotErrorIs(t, err, ErrMessagesNotRendered, body)
	}
}

// TestMessagesChatErrorsNameTheBlock pins that a block's error says where it is.
func TestMessagesChatErrorsNameTheBlock(t *testing.T) {
	_, err := MessagesChat([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"},{"type":"image","source":{"data":"x"}}]}]}`), DefaultLimits())
	require.ErrorIs(t, err, ErrMessagesNotRendered)
	assert.Contains(t, err.Error(), "messages[1]: ")
	assert.Contains(t, err.Error(), "content[1]: ")
	assert.False(t, errors.Is(err, ErrBadRequest))
}

// TestPyDumpsIsCPythons pins appendPyDumps against CPython 3's json.dumps(json.loads(s))
// (outputs recorded from CPython 3.12).
func TestPyDumpsIsCPythons(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"a":1,"b":[1,2.50,-0,1e2,1E-7,0.0001,0.00001,1e16,123456789012345678.0,-0.0,3.14159],"c":"é\u00e9😀\u007f\n\"","a":true,"d":null,"e":{}, "f":[]}`,
			`{"a": true, "b": [1, 2.5, 0, 100.0, 1e-07, 0.0001, 1e-05, 1e+16, 1.2345678901234568e+17, -0.0, 3.14159], "c": "\u00e9\u00e9\ud83d\ude00\u007f\n\"", "d": null, "e": {}, "f": []}`},
		{`{"x":1e15,"y":1.5e300,"z":12345678901234567890,"w":5e-324}`,
			`{"x": 1000000000000000.0, "y": 1.5e+300, "z": 12345678901234567890, "w": 5e-324}`},
		{`{"k\t\u0001":"/\\\b\f\r"}`, `{"k\t\u0001": "/\\\b\f\r"}`},
	}
	for _, tt := range tests {
		v, err := jsonv.Parse([]byte(tt.in), 16)
		require.NoError(t, err)
		size, err := pyDumpsSize(v)
		require.NoError(t, err)
		got := string(appendPyDumps(nil, v))
		assert.Equal(t, tt.want, got)
		assert.Len(t, got, size, "pyDumpsSize")
	}
}

// TestMessagesChatRendersAsItsChatCompletionsTwin holds a Messages body's chat to the
// chat-completions request vLLM converts it into (both render through the same path):
// the twin parsed by Parse must give the same chat, and Qwen3's template and ChatML
// the same prompt.
func TestMessagesChatRendersAsItsChatCompletionsTwin(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile("testdata/" + name)
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name     string
		messages string
		chat     string
		contains string // a piece of the prompt that shows the feature rendered
	}{
		{"text turns with a system prompt",
			`{"model":"m","max_tokens":100,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi."},{"type":"text","text":"Who are you?"}]},` +
				`{"role":"assistant","content":[{"type":"text","text":"An assistant."}]},{"role":"user","content":"Thanks."}]}`,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi."},{"type":"text","text":"Who are you?"}]},` +
				`{"role":"assistant","content":"An assistant."},{"role":"user","content":"Thanks."}]}`,
			"Hi.\nWho are you?"},
		{"an assistant prefill is rendered closed, then the generation prompt",
			`{"model":"m","messages":[{"role":"user","content":"Count to three."},{"role":"assistant","content":"One, two,"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"Count to three."},{"role":"assistant","content":"One, two,"}]}`,
			"One, two,<|im_end|>\n<|im_start|>assistant\n"},
		{"effort and kwargs",
			`{"model":"m","messages":[{"role":"user","content":"q"}],"output_config":{"effort":"medium"},"chat_template_kwargs":{"enable_thinking":false}}`,
			`{"model":"m","messages":[{"role":"user","content":"q"}],"reasoning_effort":"medium","chat_template_kwargs":{"enable_thinking":false}}`,
			"<think>\n\n</think>"},
		{"a Claude Code turn with tools, tool_use and tool_result", read("messages_claude_code.json"), read("messages_claude_code.chat.json"),
			`<tool_call>
{"name": "Edit", "arguments": {"file_path": "/home/dev/kvroute/openai/fuzz_test.go"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := messagesChat(t, tt.messages)
			twin, err := Parse(ChatCompletions, []byte(tt.chat), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, chatDump(twin.Chat), chatDump(got))
			rendersAsTwin(t, got, twin.Chat, tt.contains)
		})
	}
}

// TestMessagesChatOfClaudeCodeRoutesAsItsPrefix pins what makes Claude Code's turns
// share a prefix: the billing header, which changes every request, is not in the
// prompt, and the next turn's prompt extends this one's up to the generation prompt.
func TestMessagesChatOfClaudeCodeRoutesAsItsPrefix(t *testing.T) {
	body, err := os.ReadFile("testdata/messages_claude_code.json")
	require.NoError(t, err)
	var req map[string]any
	require.NoError(t, json.Unmarshal(body, &req))
	render := func(req map[string]any) string {
		b, err := json.Marshal(req)
		require.NoError(t, err)
		chat, err := MessagesChat(b, DefaultLimits())
		require.NoError(t, err)
		prompt, err := qwen3Renderer(t).Render(chat)
		require.NoError(t, err)
		return prompt
	}
	first := render(req)
	assert.NotContains(t, first, "billing")
	system := req["system"].([]any)
	system[0].(map[string]any)["text"] = "x-anthropic-billing-header: cc_version=2.1.38.ffe; cc_entrypoint=cli;"
	req["messages"] = append(req["messages"].([]any),
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "All tests pass."}}},
		map[string]any{"role": "user", "content": "Commit it."})
	next := render(req)
	cut := strings.LastIndex(first, "<|im_start|>assistant")
	assert.True(t, strings.HasPrefix(next, first[:cut]), "the next turn extends the prompt")
}

// TestMessagesChatBoundsItsMemory pins that a body of tiny values is not rendered
// (routed by load) and that a real conversation is.
func TestMessagesChatBoundsItsMemory(t *testing.T) {
	tiny := `{"model":"m","messages":[{"role":"user","content":"hi","x":[` + tinyValues(1<<20, "0") + `]}]}`
	_, err := MessagesChat([]byte(tiny), DefaultLimits())
	require.ErrorIs(t, err, ErrMessagesNotRendered)
	assert.Contains(t, err.Error(), "bytes per byte of the request body")

	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	for i := range 2000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("word ", 40) + `"}]},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"c","name":"shell","input":{"cmd":"ls -la"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"` + strings.Repeat("file ", 40) + `"}]}`)
	}
	b.WriteString(`]}`)
	chat, err := MessagesChat([]byte(b.String()), DefaultLimits())
	require.NoError(t, err)
	assert.Len(t, chat.Messages, 6000)
}

// TestMessagesChatAllocatesInProportionToTheBody pins what the densest inputs cost: the
// values read (at most 4 bytes per byte of body) and the chat built from them (at most
// as much again, else the request is not rendered), at most about 8 times the body.
func TestMessagesChatAllocatesInProportionToTheBody(t *testing.T) {
	messagesOf := func(item string) string { return `"messages":[` + tinyValues(1<<20, item) + `]` }
	blocksOf := func(role, block string) string {
		return `"messages":[{"role":"` + role + `","content":[` + tinyValues(1<<20, block) + `]}]`
	}
	tests := []struct {
		name    string
		members string
	}{
		{"string messages", messagesOf(`{"role":"user","content":""}`)},
		{"messages of one block", messagesOf(`{"role":"user","content":[{"type":"text","text":"a"}]}`)},
		{"text blocks", blocksOf("user", `{"type":"text","text":"a"}`)},
		{"thinking blocks", blocksOf("assistant", `{"type":"thinking","thinking":""}`)},
		{"tool_use blocks", blocksOf("assistant", `{"type":"tool_use","id":"i","input":{"a":0}}`)},
		{"tool_use inputs of escapes", `"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"i","input":{"a":"` +
			strings.Repeat("😀", 1<<18) + `","b":[` + tinyValues(1<<18, "0") + `]}}]}]`},
		{"user tool results", blocksOf("user", `{"type":"tool_result"}`)},
		{"tool results of texts", `"messages":[{"role":"user","content":[{"type":"tool_result","content":[` + tinyValues(1<<20, `{"type":"text","text":"a"}`) + `]}]}]`},
		{"assistant tool results", blocksOf("assistant", `{"type":"tool_result","content":"a"}`)},
		{"tools", `"messages":[{"role":"user","content":"q"}],"tools":[` + tinyValues(1<<20, `{"name":"","input_schema":{}}`) + `]`},
		{"leading system messages", messagesOf(`{"role":"system","content":"a"}`)},
		{"inline system messages after users", `"system":"s",` + messagesOf(`{"role":"user","content":"u"},{"role":"system","content":"a"}`)},
		{"inline system messages after tool results", `"system":"s",` + messagesOf(`{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]},{"role":"system","content":"a"}`)},
		{"an inline system message of text blocks", `"system":"s","messages":[{"role":"user","content":"u"},{"role":"system","content":[` + tinyValues(1<<20, `{"type":"text","text":"a"}`) + `]}]`},
		{"inline system messages after assistants", `"system":"s",` + messagesOf(`{"role":"assistant","content":"x"},{"role":"system","content":"a"},{"role":"system","content":"b"}`)},
		{"inline system messages folded into a user message of tool results and other blocks", `"messages":[{"role":"user","content":[` +
			strings.Repeat(`{"type":"tool_result"},{"type":"tool_result"},{"type":"tool_result"},{"type":"redacted_thinking"},`, 20000) +
			`{"type":"redacted_thinking"}]},` + tinyValues(1<<20, `{"role":"system","content":"s"}`) + `]`},
		{"inline system messages held after a tool_use", `"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"i"}]},` +
			tinyValues(1<<20, `{"role":"system","content":"s"}`) + `,{"role":"user","content":"u"}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(`{"model":"m",` + tt.members + `}`)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			chat, err := MessagesChat(body, DefaultLimits())
			runtime.ReadMemStats(&after)
			if err != nil {
				require.ErrorIs(t, err, ErrMessagesNotRendered)
			}
			runtime.KeepAlive(chat)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%.1f bytes per byte of body, rendered: %v", float64(allocated)/float64(len(body)), err == nil)
			assert.Less(t, allocated, uint64(9*len(body)))
		})
	}
}

// benchMessagesBody is benchChatBody's conversation as a Messages API body, as Claude
// Code sends it: the system prompt as text blocks after a billing header, user turns
// of text blocks, answers as text blocks.
func benchMessagesBody(tb testing.TB) []byte {
	tb.Helper()
	var chat struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(benchChatBody(tb), &chat); err != nil {
		tb.Fatal(err)
	}
	var messages []any
	for _, m := range chat.Messages[1:] {
		messages = append(messages, map[string]any{"role": m.Role, "content": []any{map[string]any{"type": "text", "text": m.Content}}})
	}
	system := []any{map[string]any{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli;"},
		map[string]any{"type": "text", "text": chat.Messages[0].Content, "cache_control": map[string]any{"type": "ephemeral"}}}
	body, err := json.Marshal(map[string]any{"model": "Qwen/Qwen3-8B", "system": system, "messages": messages,
		"max_tokens": 256, "stream": true})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkMessagesChatTurn12 is ParseMessages then MessagesChat of the same 12-turn
// conversation as a Messages API body: what the filter does before the router's
// render, against BenchmarkParseChatTurn12's Parse.
func BenchmarkMessagesChatTurn12(b *testing.B) {
	body := benchMessagesBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMessages(body, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
		if _, err := MessagesChat(body, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}
