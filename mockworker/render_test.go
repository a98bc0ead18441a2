package mockworker

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The three bodies of one conversation: a chat, and the Responses and Messages bodies
// vLLM converts to it.
const (
	renderChatBody      = `{"model":"mock","max_tokens":3,"messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Which flags matter?"}]}`
	renderResponsesBody = `{"model":"mock","max_output_tokens":3,"store":false,"instructions":"Answer briefly.","input":[{"role":"user","content":[{"type":"input_text","text":"Which flags matter?"}]}]}`
	renderMessagesBody  = `{"model":"mock","max_tokens":3,"system":"Answer briefly.","messages":[{"role":"user","content":[{"type":"text","text":"Which flags matter?"}]}]}`
)

// postRender posts body to a render path and decodes a GenerateRequest reply.
func postRender(t *testing.T, url, path, body string) (int, generateRequest) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var g generateRequest
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, &g), string(b))
	}
	return resp.StatusCode, g
}

// TestRenderServesResponsesAndMessages: /v1/responses/render and /v1/messages/render
// answer one GenerateRequest, as vLLM's do, whose ids are those the chat render gives
// the chat vLLM converts the body to.
func TestRenderServesResponsesAndMessages(t *testing.T) {
	_, _, url := start(t)
	status, chat := postRender(t, url, "/v1/chat/completions/render", renderChatBody)
	require.Equal(t, http.StatusOK, status)
	require.NotEmpty(t, chat.TokenIDs)
	for _, tt := range []struct{ path, body, idPrefix string }{
		{"/v1/responses/render", renderResponsesBody, "resp_"},
		{"/v1/messages/render", renderMessagesBody, "chatcmpl-"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			status, g := postRender(t, url, tt.path, tt.body)
			require.Equal(t, http.StatusOK, status)
			assert.Equal(t, chat.TokenIDs, g.TokenIDs, "the chat twin's ids")
			assert.Equal(t, "mock", g.Model)
			assert.Equal(t, 3, int(g.SamplingParams["max_tokens"].(float64)))
			assert.True(t, strings.HasPrefix(g.RequestID, tt.idPrefix), g.RequestID)
		})
	}
	// vLLM's render is stateless: a body naming a stored response is refused.
	status, _ = postRender(t, url, "/v1/responses/render", `{"model":"mock","input":"x","previous_response_id":"resp_1"}`)
	assert.Equal(t, http.StatusBadRequest, status)
	status, _ = postRender(t, url, "/v1/messages/render", `{"model":"mock","max_tokens":3,"messages":"x"}`)
	assert.Equal(t, http.StatusBadRequest, status)
}
