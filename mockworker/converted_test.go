package mockworker

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

// postBody posts body to path and returns the status and the whole answer.
func postBody(t *testing.T, url, path, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

// TestMessagesAndResponsesGenerateOnTheirChat: /v1/messages and /v1/responses generate
// on the chat vLLM converts the body to (the chat twin's prompt, whose blocks the second
// of them finds cached), and answer in their API's shape, streamed (named events, the
// text in the deltas, the usage kvroute reads last) or whole.
func TestMessagesAndResponsesGenerateOnTheirChat(t *testing.T) {
	_, _, url := start(t)
	status, _, b := postBody(t, url, "/v1/chat/completions", renderChatBody)
	require.Equal(t, http.StatusOK, status, string(b))
	chat, found, err := openai.ParseUsage(b)
	require.True(t, found)
	require.NoError(t, err)
	stream := func(body string) string {
		return strings.Replace(body, `{"model":"mock",`, `{"model":"mock","stream":true,`, 1)
	}
	tests := []struct {
		name, path, body string
		events           []string // the named events, in order, one of each run of deltas
		delta            string   // the deltas' event
	}{
		{"messages", "/v1/messages", renderMessagesBody, nil, ""},
		{"messages streamed", "/v1/messages", stream(renderMessagesBody),
			[]string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, "content_block_delta"},
		{"responses", "/v1/responses", renderResponsesBody, nil, ""},
		{"responses streamed", "/v1/responses", stream(renderResponsesBody),
			[]string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done",
				"response.completed"}, "response.output_text.delta"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, h, b := postBody(t, url, tt.path, tt.body)
			require.Equal(t, http.StatusOK, status, string(b))
			assert.Equal(t, "w0", h.Get("x-served-by"))
			u, found, err := openai.ParseUsage(b)
			require.True(t, found, string(b))
			require.NoError(t, err)
			assert.Equal(t, chat.PromptTokens, u.PromptTokens, "the chat twin's prompt")
			assert.Positive(t, u.CachedTokens, "its blocks are the chat twin's")
			if tt.events == nil {
				var whole struct {
					Type, Object, Status string
					Content              []struct{ Text string }
					Output               []struct{ Content []struct{ Text string } }
				}
				require.NoError(t, json.Unmarshal(b, &whole))
				if tt.path == "/v1/messages" {
					assert.Equal(t, "message", whole.Type)
					require.Len(t, whole.Content, 1)
					assert.Len(t, strings.Fields(whole.Content[0].Text), 3)
					return
				}
				assert.Equal(t, "response", whole.Object)
				assert.Equal(t, "completed", whole.Status)
				require.Len(t, whole.Output, 1)
				require.Len(t, whole.Output[0].Content, 1)
				assert.Len(t, strings.Fields(whole.Output[0].Content[0].Text), 3)
				return
			}
			var events []string
			var text strings.Builder
			for _, block := range bytes.Split(bytes.TrimSpace(b), []byte("\n\n")) {
				name, data, ok := bytes.Cut(block, []byte("\ndata: "))
				require.True(t, ok, string(block))
				name = bytes.TrimPrefix(name, []byte("event: "))
				var fields map[string]any
				require.NoError(t, json.Unmarshal(data, &fields), string(data))
				assert.Equal(t, string(name), fields["type"], "each event's type is its name")
				if len(events) == 0 || events[len(events)-1] != string(name) {
					events = append(events, string(name))
				}
				if string(name) == tt.delta {
					if d, ok := fields["delta"].(string); ok {
						text.WriteString(d)
					} else {
						text.WriteString(fields["delta"].(map[string]any)["text"].(string))
					}
				}
			}
			assert.Equal(t, tt.events, events)
			assert.Len(t, strings.Fields(text.String()), 3, "max_tokens words, one token each")
		})
	}
}

// TestResponsesWantStoreFalse: the worker keeps no responses, so it refuses a body that
// would have one stored or that continues one.
func TestResponsesWantStoreFalse(t *testing.T) {
	_, _, url := start(t)
	for _, body := range []string{
		`{"model":"mock","input":"x"}`,
		`{"model":"mock","store":false,"input":"x","previous_response_id":"resp_1"}`,
	} {
		status, _, b := postBody(t, url, "/v1/responses", body)
		assert.Equal(t, http.StatusBadRequest, status, body)
		assert.Contains(t, string(b), `"error"`)
	}
	status, _, b := postBody(t, url, "/v1/messages", `{"model":"mock","max_tokens":3,"messages":"x"}`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, string(b), `"type":"error"`, "Anthropic's error shape")
}
