package template

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// convertedLive converts chat's values as a render in format does (its messages,
// tools, documents and kwargs) and returns the bytes they keep live.
func convertedLive(t *testing.T, chat *tokenize.Chat, format ContentFormat) int {
	t.Helper()
	var kept struct {
		messages    []jinja.Value
		tools, docs jinja.Value
		kwargs      map[string]jinja.Value
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var err error
	kept.messages, _, err = conversation(chat.Messages, format)
	require.NoError(t, err)
	if chat.Tools != nil {
		kept.tools = toolsValue(chat.Tools)
	}
	if chat.Documents != nil {
		kept.docs = listValue(chat.Documents)
	}
	kept.kwargs = map[string]jinja.Value{}
	err = mergeKwargs(kept.kwargs, chat.TemplateKwargs, chat.Documents != nil)
	require.NoError(t, err)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(&kept)
	return int(after.HeapAlloc) - int(before.HeapAlloc)
}

// TestConvertedCostBoundsTheConvertedValues pins convertedCost as an estimate from
// above of what a chat's values keep live once converted, on the shapes it once
// underestimated: in the openai content format each content part, a plain string
// included, becomes a new dict (a chat of two-letter string parts took 13 times the
// estimate); an assistant's reasoning is converted twice (1.6 times); a dict of more
// than 8 keys has a map of up to 16/7 slots a key (up to 1.6 times), in the request's
// values and in a tool call's parsed arguments.
func TestConvertedCostBoundsTheConvertedValues(t *testing.T) {
	repeat := func(n int, format string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = strings.ReplaceAll(format, "%d", fmt.Sprint(i))
		}
		return strings.Join(parts, ",")
	}
	user := `{"role":"user","content":"hi"}`
	dict := func(keys int, value string) string { return "{" + repeat(keys, `"k%d":`+value) + "}" }
	tests := []struct {
		name string
		body string
	}{
		{"short messages", `{"model":"m","messages":[` + repeat(20_000, `{"role":"user","content":"x"}`) + `]}`},
		{"two-letter string content parts", `{"model":"m","messages":[{"role":"user","content":[` + repeat(50_000, `"ab"`) + `]}]}`},
		{"text content parts", `{"model":"m","messages":[{"role":"user","content":[` + repeat(20_000, `{"type":"text","text":"ab"}`) + `]}]}`},
		{"reasoning of small objects", `{"model":"m","messages":[` + user + `,{"role":"assistant","content":"x","reasoning":[` +
			repeat(20_000, `{"abcd":"efgh"}`) + `]}]}`},
		{"kwargs of dicts of 453 keys", `{"model":"m","messages":[` + user + `],"chat_template_kwargs":{"x":[` +
			repeat(40, dict(453, `"x"`)) + `]}}`},
		{"kwargs of 7,368 float keys", `{"model":"m","messages":[` + user + `],"chat_template_kwargs":` + dict(7_368, `0.5`) + `}`},
		{"tools of 249 properties", `{"model":"m","messages":[` + user + `],"tools":[` + repeat(40,
			`{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":`+dict(249, `{"type":"string"}`)+`}}}`) + `]}`},
		{"tool call arguments of 921 keys", `{"model":"m","messages":[` + user + `,{"role":"assistant","tool_calls":[` +
			repeat(20, `{"id":"c%d","type":"function","function":{"name":"f","arguments":"`+strings.ReplaceAll(dict(921, `0.5`), `"`, `\"`)+`"}}`) + `]}]}`},
		{"documents", `{"model":"m","messages":[` + user + `],"documents":[` + repeat(20_000, `{"title":"t","text":"x"}`) + `]}`},
	}
	for _, tt := range tests {
		for _, format := range []ContentFormat{ContentString, ContentOpenAI} {
			t.Run(tt.name+"/"+string(format), func(t *testing.T) {
				req, err := openai.Parse(openai.ChatCompletions, []byte(tt.body), openai.DefaultLimits())
				require.NoError(t, err)
				require.NoError(t, req.Chat.Unread)
				live, estimate := convertedLive(t, req.Chat, format), convertedCost(req.Chat, format, math.MaxInt)
				t.Logf("%d-byte body: %d bytes live, estimate %d", len(tt.body), live, estimate)
				assert.LessOrEqual(t, live, estimate)
			})
		}
	}
}
