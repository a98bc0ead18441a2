package fakeworker

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// SGLang's session API, as its engine serves it (http_server.py, session_controller.py):
// a session lives in the memory of the engine that opened it.
const (
	sglangOpenSessionPath  = "/open_session"
	sglangCloseSessionPath = "/close_session"
	sglangGeneratePath     = "/generate"
)

// serveSGLangSessions answers /open_session and /close_session, and refuses a
// /generate turn naming a session this worker does not hold (session_params.id) as
// SGLang's scheduler does: 400 {"error":{"message":"Invalid request: session id <id>
// does not exist"}} when not streamed, a 200 event stream whose one event carries the
// abort in meta_info.finish_reason when streamed. It reports whether it answered.
func (w *Worker) serveSGLangSessions(rw http.ResponseWriter, r *http.Request, body []byte) bool {
	switch r.URL.Path {
	case sglangOpenSessionPath:
		var req struct {
			SessionID *string `json:"session_id"`
		}
		_ = json.Unmarshal(body, &req)
		w.mu.Lock()
		id := ""
		if req.SessionID != nil {
			id = *req.SessionID
		} else {
			w.sessionsOpened++
			id = fmt.Sprintf("%s-session-%d", w.Name, w.sessionsOpened)
		}
		_, open := w.sglangSessions[id]
		if !open {
			if w.sglangSessions == nil {
				w.sglangSessions = map[string]bool{}
			}
			w.sglangSessions[id] = true
		}
		w.mu.Unlock()
		rw.Header().Set("content-type", "application/json")
		if open {
			rw.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(rw, `{"error":{"message":"Failed to open the session. Check if a session with the same id is still open."}}`)
			return true
		}
		quoted, _ := json.Marshal(id)
		rw.Write(quoted)
		return true
	case sglangCloseSessionPath:
		var req struct {
			SessionID string `json:"session_id"`
		}
		_ = json.Unmarshal(body, &req)
		w.mu.Lock()
		delete(w.sglangSessions, req.SessionID) // an unknown one is only logged
		w.mu.Unlock()
		return true
	case sglangGeneratePath:
		var req struct {
			Stream        bool `json:"stream"`
			SessionParams *struct {
				ID *string `json:"id"`
			} `json:"session_params"`
		}
		if json.Unmarshal(body, &req) != nil || req.SessionParams == nil || req.SessionParams.ID == nil {
			return false
		}
		w.mu.Lock()
		open := w.sglangSessions[*req.SessionParams.ID]
		w.mu.Unlock()
		if open {
			return false
		}
		msg, _ := json.Marshal(fmt.Sprintf("Invalid request: session id %s does not exist", *req.SessionParams.ID))
		if req.Stream {
			rw.Header().Set("content-type", "text/event-stream")
			fmt.Fprintf(rw, "data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":\"abort\",\"message\":%s,\"status_code\":400,\"err_type\":\"BadRequestError\"}}}\n\ndata: [DONE]\n\n", msg)
			return true
		}
		rw.Header().Set("content-type", "application/json")
		rw.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(rw, `{"error":{"message":%s}}`, msg)
		return true
	}
	return false
}

// SGLangSessions returns how many SGLang sessions the worker holds open.
func (w *Worker) SGLangSessions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.sglangSessions)
}
