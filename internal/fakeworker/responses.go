package fakeworker

// OpenAI's Responses API as vLLM serves it with VLLM_ENABLE_RESPONSES_API_STORE=1: the
// store is a map in the engine's process, so only the worker that made a response knows
// it. Shapes follow vLLM's vllm/entrypoints/openai/responses (serving.py, protocol.py,
// api_router.py); see the package comment for what the fake leaves out.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

const responsesPath = "/v1/responses"

// StoredResponses returns the ids of the responses the worker's Responses store holds
// now, sorted (as strings: resp_w0_10 sorts before resp_w0_2). POST /v1/responses adds
// one unless the request says "store":false or is cut off mid-stream; Kill and Restart
// empty the store, as a restarted engine's is empty, while Close leaves it.
func (w *Worker) StoredResponses() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.stored))
	for id := range w.stored {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// forgetEngineState empties what lives in the engine's memory, the Responses store
// and SGLang's sessions: the engine's process is gone. Requests begun before this
// store nothing.
func (w *Worker) forgetEngineState() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stored = nil
	w.sglangSessions = nil
	w.epoch++
}

// responsesRequest is the part of a POST /v1/responses body the fake reads.
type responsesRequest struct {
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Store              *bool             `json:"store"` // absent: true, as in vLLM
	Stream             bool              `json:"stream"`
	Background         bool              `json:"background"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	Metadata           json.RawMessage   `json:"metadata"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	User               *string           `json:"user"`
}

// response is vLLM's ResponsesResponse, its fields in vLLM's order.
type response struct {
	ID                 string            `json:"id"`
	CreatedAt          int64             `json:"created_at"`
	IncompleteDetails  json.RawMessage   `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	Metadata           json.RawMessage   `json:"metadata"`
	Model              string            `json:"model"`
	Object             string            `json:"object"`
	Output             []outputMessage   `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	Temperature        float64           `json:"temperature"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	TopP               float64           `json:"top_p"`
	Background         bool              `json:"background"`
	MaxOutputTokens    int               `json:"max_output_tokens"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Prompt             json.RawMessage   `json:"prompt"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	ServiceTier        string            `json:"service_tier"`
	Status             string            `json:"status"`
	Text               json.RawMessage   `json:"text"`
	TopLogprobs        *int              `json:"top_logprobs"`
	Truncation         string            `json:"truncation"`
	Usage              *responsesUsage   `json:"usage"`
	User               *string           `json:"user"`
	InputMessages      json.RawMessage   `json:"input_messages"`
	OutputMessages     json.RawMessage   `json:"output_messages"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

type outputText struct {
	Annotations []any  `json:"annotations"`
	Text        string `json:"text"`
	Type        string `json:"type"`
}

type responsesUsage struct {
	InputTokens         int `json:"input_tokens"`
	InputTokensDetails  any `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails any `json:"output_tokens_details"`
	TotalTokens         int `json:"total_tokens"`
}

// defaultResponsesUsage is the usage every response reports: the numbers of the chat
// default (10 in, 4 of them cached, 3 out).
func defaultResponsesUsage() *responsesUsage {
	return &responsesUsage{
		InputTokens: 10,
		InputTokensDetails: map[string]any{
			"cached_tokens": 4, "input_tokens_per_turn": []int{}, "cached_tokens_per_turn": []int{},
		},
		OutputTokens: 3,
		OutputTokensDetails: map[string]any{
			"reasoning_tokens": 0, "tool_output_tokens": 0,
			"output_tokens_per_turn": []int{}, "tool_output_tokens_per_turn": []int{},
		},
		TotalTokens: 13,
	}
}

// newResponse is the response to req with id, generating nothing yet.
func newResponse(req *responsesRequest, id, status string) *response {
	r := &response{
		ID: id, CreatedAt: time.Now().Unix(), Instructions: req.Instructions,
		Metadata: req.Metadata, Model: req.Model, Object: "response", Output: []outputMessage{},
		ParallelToolCalls: true, Temperature: 1, ToolChoice: req.ToolChoice, Tools: req.Tools,
		TopP: 1, Background: req.Background, MaxOutputTokens: 4096, MaxToolCalls: req.MaxToolCalls,
		PreviousResponseID: req.PreviousResponseID, ServiceTier: "auto", Status: status,
		Truncation: "disabled", User: req.User,
	}
	if r.ToolChoice == nil {
		r.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.Tools == nil {
		r.Tools = []json.RawMessage{}
	}
	if req.Temperature != nil {
		r.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		r.TopP = *req.TopP
	}
	if req.MaxOutputTokens != nil {
		r.MaxOutputTokens = *req.MaxOutputTokens
	}
	return r
}

// complete makes r a completed response that generated text.
func complete(r *response, text string) {
	r.Status = "completed"
	r.Output = []outputMessage{message(r.ID, text, "completed")}
	r.Usage = defaultResponsesUsage()
}

// message is the output message of the response with id: msg_<name>_<n> for
// resp_<name>_<n>.
func message(respID, text, status string) outputMessage {
	m := outputMessage{ID: "msg_" + strings.TrimPrefix(respID, "resp_"), Role: "assistant", Status: status, Type: "message"}
	m.Content = []outputText{}
	if status == "completed" {
		m.Content = []outputText{{Annotations: []any{}, Text: text, Type: "output_text"}}
	}
	return m
}

func (r *response) clone() *response {
	c := *r
	c.Output = slices.Clone(r.Output)
	return &c
}

// errorBody is vLLM's ErrorResponse.
func errorBody(message, typ string, param *string, code int) []byte {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type, e.Error.Param, e.Error.Code = message, typ, param, code
	b, _ := json.Marshal(e)
	return b
}

func writeJSON(rw http.ResponseWriter, code int, body []byte) {
	rw.Header().Set("content-type", "application/json")
	rw.WriteHeader(code)
	_, _ = rw.Write(body)
}

// writeNotFound answers as vLLM does for a response id its store does not hold, be it
// a previous_response_id or the id of GET /v1/responses/{id}: param is "response_id"
// either way.
func writeNotFound(rw http.ResponseWriter, id string) {
	param := "response_id"
	writeJSON(rw, http.StatusNotFound,
		errorBody(fmt.Sprintf("Response with id '%s' not found.", id), "invalid_request_error", &param, http.StatusNotFound))
}

// serveResponses serves /v1/responses and the paths under it. serve has recorded the
// request.
func (w *Worker) serveResponses(rw http.ResponseWriter, r *http.Request, body []byte) {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, responsesPath), "/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		w.createResponse(rw, r, body)
	case rest != "" && action == "" && r.Method == http.MethodGet:
		w.mu.Lock()
		s := w.stored[id]
		var out []byte
		if s != nil {
			out, _ = json.Marshal(s)
		}
		w.mu.Unlock()
		if s == nil {
			writeNotFound(rw, id)
			return
		}
		writeJSON(rw, http.StatusOK, out)
	case id != "" && action == "cancel" && r.Method == http.MethodPost:
		w.cancelResponse(rw, id)
	case rest == "" || (id != "" && (action == "" || action == "cancel")):
		// FastAPI's answer to a method the route does not have.
		writeJSON(rw, http.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
	default:
		writeJSON(rw, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
	}
}

// cancelResponse cancels a background response that is still generating, as vLLM
// does: a finished one is an error.
func (w *Worker) cancelResponse(rw http.ResponseWriter, id string) {
	w.mu.Lock()
	s := w.stored[id]
	var out []byte
	cancelled := false
	if s != nil && (s.Status == "queued" || s.Status == "in_progress") {
		s.Status = "cancelled"
		cancelled = true
	}
	if s != nil {
		out, _ = json.Marshal(s)
	}
	w.mu.Unlock()
	switch {
	case s == nil:
		writeNotFound(rw, id)
	case !cancelled:
		param := "response_id"
		writeJSON(rw, http.StatusBadRequest,
			errorBody("Cannot cancel a synchronous response.", "invalid_request_error", &param, http.StatusBadRequest))
	default:
		writeJSON(rw, http.StatusOK, out)
	}
}

// createResponse serves POST /v1/responses.
func (w *Worker) createResponse(rw http.ResponseWriter, r *http.Request, body []byte) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil || len(req.Input) == 0 {
		msg := "input: Field required"
		if err != nil {
			msg = "JSON decode error: " + err.Error()
		}
		writeJSON(rw, http.StatusBadRequest, errorBody(msg, "BadRequestError", nil, http.StatusBadRequest))
		return
	}
	store := req.Store == nil || *req.Store
	if req.Background && !store {
		writeJSON(rw, http.StatusBadRequest,
			errorBody("background can only be used when `store` is true", "BadRequestError", nil, http.StatusBadRequest))
		return
	}
	w.mu.Lock()
	epoch := w.epoch
	var prev *response
	if req.PreviousResponseID != nil {
		prev = w.stored[*req.PreviousResponseID]
	}
	w.mu.Unlock()
	if req.PreviousResponseID != nil && prev == nil {
		writeNotFound(rw, *req.PreviousResponseID)
		return
	}
	has := func(s string) bool { return bytes.Contains(body, []byte(s)) }
	hangs := has("HANG_BEFORE_FIRST_TOKEN") || has("HANG_AFTER_FIRST_TOKEN") || has("HANG_AFTER_HEADERS")

	switch {
	case req.Background && !has("FAIL_UPSTREAM"):
		// vLLM answers at once with the queued response and generates in the
		// background. Here generation ends before the answer, unless a HANG_ prompt
		// keeps the response queued (for cancel) until the worker forgets it.
		resp := newResponse(&req, w.newResponseID(), "queued")
		queued, _ := json.Marshal(resp)
		if !hangs {
			complete(resp, text(body, req.Model, "hello from "+w.Name))
		}
		w.storeResponse(epoch, resp)
		writeJSON(rw, http.StatusOK, queued)
	case has("HANG_BEFORE_FIRST_TOKEN"):
		<-r.Context().Done()
	case has("HANG_AFTER_HEADERS"):
		if req.Stream {
			rw.Header().Set("content-type", "text/event-stream; charset=utf-8")
		} else {
			rw.Header().Set("content-type", "application/json")
		}
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
	case has("FAIL_UPSTREAM"):
		writeJSON(rw, http.StatusServiceUnavailable,
			[]byte(`{"error":{"message":"engine overloaded","type":"server_error","param":null,"code":null}}`))
	case req.Stream:
		w.streamResponse(rw, r, body, epoch, &req, store)
	default:
		resp := newResponse(&req, w.newResponseID(), "in_progress")
		complete(resp, text(body, req.Model, "hello from "+w.Name))
		out, _ := json.Marshal(resp)
		if store {
			w.storeResponse(epoch, resp.clone())
		}
		rw.Header().Set("content-type", "application/json")
		w.writeSplit(rw, maybeGzip(rw, body, out))
	}
}

// newResponseID hands out the next resp_<name>_<n>.
func (w *Worker) newResponseID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastResp++
	return fmt.Sprintf("resp_%s_%d", w.Name, w.lastResp)
}

// storeResponse stores resp, unless the worker was killed or restarted since the
// request began (epoch).
func (w *Worker) storeResponse(epoch uint64, resp *response) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.epoch != epoch {
		return
	}
	if w.stored == nil {
		w.stored = map[string]*response{}
	}
	w.stored[resp.ID] = resp
}

// streamResponse answers with vLLM's event stream: response.created,
// response.in_progress, the message's output_item.added and content_part.added, three
// output_text.delta, their output_text.done, content_part.done and output_item.done, and
// response.completed. Like vLLM, it stores the response as it completes; it sends no
// [DONE].
func (w *Worker) streamResponse(rw http.ResponseWriter, r *http.Request, body []byte, epoch uint64, req *responsesRequest, store bool) {
	rw.Header().Set("content-type", "text/event-stream; charset=utf-8")
	resp := newResponse(req, w.newResponseID(), "in_progress")
	msg := message(resp.ID, "", "in_progress")
	seq := 0
	var buf bytes.Buffer // the whole stream, when SplitResponses cuts it
	split := w.split.Load() != nil
	hang := strings.Contains(string(body), "HANG_AFTER_FIRST_TOKEN") && !split
	send := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		data, _ := json.Marshal(fields)
		ev := fmt.Sprintf("event: %s\ndata: %s\n\n", typ, data)
		if split {
			buf.WriteString(ev)
			return
		}
		_, _ = rw.Write([]byte(ev))
		rw.(http.Flusher).Flush()
	}
	initial := resp.clone()
	send("response.created", map[string]any{"response": initial})
	send("response.in_progress", map[string]any{"response": initial})
	at := func(fields map[string]any) map[string]any {
		fields["output_index"] = 0
		if _, ok := fields["item"]; !ok {
			fields["item_id"], fields["content_index"] = msg.ID, 0
		}
		return fields
	}
	send("response.output_item.added", at(map[string]any{"item": msg}))
	send("response.content_part.added", at(map[string]any{"part": outputText{Annotations: []any{}, Type: "output_text"}}))
	var all strings.Builder
	for i := range 3 {
		delta := text(body, req.Model, fmt.Sprintf("t%d ", i))
		all.WriteString(delta)
		send("response.output_text.delta", at(map[string]any{"delta": delta, "logprobs": []any{}}))
		if hang {
			<-r.Context().Done()
			return
		}
	}
	part := outputText{Annotations: []any{}, Text: all.String(), Type: "output_text"}
	send("response.output_text.done", at(map[string]any{"text": part.Text, "logprobs": []any{}}))
	send("response.content_part.done", at(map[string]any{"part": part}))
	complete(resp, part.Text)
	send("response.output_item.done", at(map[string]any{"item": resp.Output[0]}))
	if store {
		w.storeResponse(epoch, resp.clone())
	}
	send("response.completed", map[string]any{"response": resp})
	if split {
		w.writeSplit(rw, buf.Bytes())
	}
}
