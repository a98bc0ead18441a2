package fakeworker

// Anthropic's Messages API as vLLM serves it (vllm/entrypoints/anthropic: api_router.py,
// serving.py): a whole message as JSON, or a stream of named events, message_start to
// message_stop. Enough for a client to read the reply and for kvroute's response
// handling to see vLLM's shapes; the text is the fake's, not a model's.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

const messagesPath = "/v1/messages"

// messagesRequest is the part of a POST /v1/messages body the fake reads.
type messagesRequest struct {
	Model    string          `json:"model"`
	Messages json.RawMessage `json:"messages"`
	Stream   bool            `json:"stream"`
}

// serveMessages serves POST /v1/messages; a body vLLM's request model refuses (no
// model or messages) gets its 400 in Anthropic's error shape.
func (w *Worker) serveMessages(rw http.ResponseWriter, r *http.Request, body []byte) {
	var req messagesRequest
	if r.Method != http.MethodPost || r.URL.Path != messagesPath {
		writeJSON(rw, http.StatusNotFound, anthropicError("not_found_error", "Not Found"))
		return
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || len(req.Messages) == 0 {
		writeJSON(rw, http.StatusBadRequest, anthropicError("invalid_request_error", "model and messages are required"))
		return
	}
	switch {
	case strings.Contains(string(body), "FAIL_UPSTREAM"):
		writeJSON(rw, http.StatusServiceUnavailable, anthropicError("api_error", "engine overloaded"))
		return
	case strings.Contains(string(body), "HANG_BEFORE_FIRST_TOKEN"):
		<-r.Context().Done()
		return
	}
	id := fmt.Sprintf("msg_%s_%d", w.Name, w.nextMessage())
	reply := "hello from " + w.Name
	if !req.Stream {
		out, _ := json.Marshal(map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content":     []map[string]any{{"type": "text", "text": reply}},
			"stop_reason": "end_turn",
			"usage":       messagesUsage(3),
		})
		writeJSON(rw, http.StatusOK, out)
		return
	}
	rw.Header().Set("content-type", "text/event-stream")
	event := func(name string, data map[string]any) {
		out, _ := json.Marshal(data)
		fmt.Fprintf(rw, "event: %s\ndata: %s\n\n", name, out)
		rw.(http.Flusher).Flush()
	}
	event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
		"stop_reason": nil, "usage": messagesUsage(0),
	}})
	event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]any{"type": "text", "text": ""}})
	for _, piece := range strings.SplitAfter(reply, " ") {
		event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": piece}})
	}
	event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "end_turn"}, "usage": messagesUsage(3)})
	event("message_stop", map[string]any{"type": "message_stop"})
}

// messagesUsage is the usage vLLM's /v1/messages reports for a 10-token prompt of which
// 4 were cached, with prompt token details on: Anthropic's input_tokens leave out the
// cache reads (vLLM's _build_anthropic_usage).
func messagesUsage(output int) map[string]any {
	return map[string]any{"input_tokens": 6, "output_tokens": output, "cache_read_input_tokens": 4}
}

// anthropicError is an error body as vLLM's /v1/messages writes it.
func anthropicError(typ, message string) []byte {
	out, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": message}})
	return out
}

// nextMessage numbers the worker's messages.
func (w *Worker) nextMessage() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.messages++
	return w.messages
}
