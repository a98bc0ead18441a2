package mockworker

// SGLang's sessions (continual prompting), as SGLang serves them: /open_session and
// /close_session (http_server.py, GET or POST with a JSON body), and /generate's
// session_params (io_struct.py's SessionParams), which the scheduler turns into a
// prompt rebuilt from the session's own history (session_controller.py's
// Session.create_req). The engine sees that whole prompt: its prefix cache, its KV
// events, meta_info's prompt_tokens and cached_tokens.
//
// A session's history is a tree of requests (nodes) keyed by rid. In an ordinary
// session a request continues from the finished request session_params.rid names (its
// prompt ids, then its output ids, unless drop_previous_output; cut to the first offset
// tokens when offset is not 0, as Python's ids[:offset]), and from nothing without a
// rid: as SGLang, the session's last request is not followed implicitly. replace
// clears the children of the node rid names (all nodes, without rid) before
// continuing from it. A session opened with streaming true (as SGLang launched with
// --enable-streaming-session) keeps only its last finished request and appends to it
// implicitly; it refuses a second request in flight, replace, drop_previous_output and
// offset. A leading BOS of the new input is dropped when there is a history, as
// create_req does.
//
// An unknown session id, an unknown rid, or a rid whose request has not finished
// aborts the request with a 400: non-streamed, SGLang's {"error": {"message"}};
// streamed, a 200 whose one chunk's meta_info.finish_reason is the abort (type
// "abort", status_code 400, err_type "BadRequestError"), then data: [DONE].
//
// Where the mock differs: it holds at most sglangMaxSessions open sessions (a further
// open is refused with SGLang's refusal, a 400), and at most sglangMaxSessionNodes
// requests a session (the oldest forgotten first; its children stay, as roots),
// where SGLang bounds neither; timeout is read but no session expires; replace does
// not abort a request still running; closing a session with a request in flight
// closes it at once (SGLang defers it to the request's end). Sessions live in the
// Server's memory, like SGLang's scheduler's: a new Server has none.

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/tokenize"
)

const (
	// sglangMaxSessions bounds the sessions open on one worker.
	sglangMaxSessions = 4096
	// sglangMaxSessionNodes bounds the requests one session remembers; each holds its
	// prompt and output ids, at most MaxModelLen tokens.
	sglangMaxSessionNodes = 64
)

// sglangOpenFailed is SGLang's refusal of /open_session (an id already open).
const sglangOpenFailed = "Failed to open the session. Check if a session with the same id is still open."

// sglangUUID is a new uuid4, as SGLang's uuid.uuid4().hex: 32 hex digits.
func (s *Server) sglangUUID() string {
	s.mu.Lock()
	hi, lo := s.rng.Uint64(), s.rng.Uint64()
	s.mu.Unlock()
	hi = hi&^(0xf<<12) | 0x4<<12 // version 4
	lo = lo&^(0x3<<62) | 0x2<<62 // variant 10
	return fmt.Sprintf("%016x%016x", hi, lo)
}

// sglangSessions are a worker's open sessions. The zero value has none.
type sglangSessions struct {
	mu   sync.Mutex
	open map[string]*sglangSession
}

// sglangSession is one open session.
type sglangSession struct {
	streaming bool
	inflight  bool // a streaming session's request is running
	nodes     map[string]*sglangNode
	seq       int // numbers the nodes in the order they were added
}

// sglangNode is a request of a session: its whole prompt and, once it finished, its
// output.
type sglangNode struct {
	rid      string
	seq      int
	parent   *sglangNode
	children []*sglangNode
	prompt   []uint32
	output   []uint32
	finished bool
}

// sglangSessionParams is a /generate body's session_params.
type sglangSessionParams struct {
	ID                 *string `json:"id"`
	RID                *string `json:"rid"`
	Offset             *int    `json:"offset"`
	Replace            *bool   `json:"replace"`
	DropPreviousOutput *bool   `json:"drop_previous_output"`
}

// parseSGLangSessionParams reads session_params: nil when absent, null or empty (SGLang
// takes a falsy dict for none), else an object of SessionParams' keys (others are
// ignored). A wrong shape is a validation error.
func parseSGLangSessionParams(raw json.RawMessage) (*sglangSessionParams, string) {
	if isNull(raw) {
		return nil, ""
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, "session_params: must be an object"
	}
	if len(fields) == 0 {
		return nil, ""
	}
	var p sglangSessionParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, "session_params: " + err.Error()
	}
	return &p, ""
}

// sglangTurn is a /generate request's place in its session, between begin and end.
type sglangTurn struct {
	session *sglangSession
	node    *sglangNode // an ordinary session's node of the request
	rid     string
	prompt  []uint32
}

// openSession opens a session, reporting false when id is open already or the worker
// holds sglangMaxSessions.
func (ss *sglangSessions) openSession(id string, streaming bool) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, ok := ss.open[id]; ok || len(ss.open) >= sglangMaxSessions {
		return false
	}
	if ss.open == nil {
		ss.open = map[string]*sglangSession{}
	}
	ss.open[id] = &sglangSession{streaming: streaming, nodes: map[string]*sglangNode{}}
	return true
}

// closeSession forgets a session; an unknown id is no error.
func (ss *sglangSessions) closeSession(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.open, id)
}

// begin places a request of rid and input ids in the session p names, as the
// scheduler's create_req does, and returns the prompt the engine computes. It returns
// a nil turn without a session, and an abort message (a 400 of SGLang's) when the
// session or the node it continues from is not there. bos is the tokenizer's BOS id,
// if it has one.
func (ss *sglangSessions) begin(p *sglangSessionParams, rid string, input []uint32, bos uint32, hasBOS bool) (*sglangTurn, []uint32, string) {
	if p == nil || p.ID == nil {
		return nil, input, ""
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sess := ss.open[*p.ID]
	if sess == nil {
		return nil, input, fmt.Sprintf("Invalid request: session id %s does not exist", *p.ID)
	}
	replace, drop := p.Replace != nil && *p.Replace, p.DropPreviousOutput != nil && *p.DropPreviousOutput
	offset := 0
	if p.Offset != nil {
		offset = *p.Offset
	}
	var last *sglangNode
	abort := ""
	switch {
	case sess.streaming:
		switch {
		case sess.inflight:
			abort = "Streaming session already has an active request."
		case replace:
			abort = "Streaming sessions do not support replace."
		case drop:
			abort = "Streaming sessions do not support drop_previous_output."
		case offset != 0:
			abort = "Streaming sessions do not support offset."
		default:
			for _, n := range sess.nodes {
				last = n // at most one
			}
		}
	case replace && p.RID == nil:
		for _, n := range sess.nodes {
			sess.remove(n)
		}
	case replace:
		if last = sess.nodes[*p.RID]; last == nil {
			abort = "Invalid request session id"
			break
		}
		sess.clearChildren(last)
	case p.RID != nil:
		if last = sess.nodes[*p.RID]; last == nil {
			abort = "Invalid request session id"
		} else if !last.finished {
			abort = "Session request is appending to a request that hasn't finished."
		}
	}
	prompt := input
	if last != nil {
		if hasBOS && len(input) > 0 && input[0] == bos {
			input = input[1:]
		}
		history := slices.Concat(last.prompt, last.output)
		if drop {
			history = slices.Clone(last.prompt)
		}
		if offset != 0 {
			history = history[:pyIndex(offset, len(history))]
		}
		prompt = append(history, input...)
	}
	if abort != "" {
		return nil, prompt, abort
	}
	turn := &sglangTurn{session: sess, rid: rid, prompt: prompt}
	if sess.streaming {
		sess.inflight = true
	} else {
		turn.node = &sglangNode{rid: rid, prompt: prompt, parent: last}
		sess.add(turn.node)
	}
	return turn, prompt, ""
}

// end records a request's end: its output (what it generated, all of it when
// completed). A streaming session's request that did not complete leaves the session
// as it was. A nil turn (no session) is nothing.
func (ss *sglangSessions) end(turn *sglangTurn, output []uint32, completed bool) {
	if turn == nil {
		return
	}
	output = slices.Clone(output)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sess := turn.session
	if turn.node != nil {
		turn.node.output, turn.node.finished = output, true
		return
	}
	sess.inflight = false
	if completed {
		sess.nodes = map[string]*sglangNode{}
		sess.add(&sglangNode{rid: turn.rid, prompt: turn.prompt, output: output, finished: true})
	}
}

// add adds a node, under its parent if it has one. A node of the same rid is replaced;
// past sglangMaxSessionNodes the oldest node is forgotten.
func (sess *sglangSession) add(n *sglangNode) {
	if old := sess.nodes[n.rid]; old != nil {
		sess.remove(old)
	}
	if len(sess.nodes) >= sglangMaxSessionNodes {
		var oldest *sglangNode
		for _, o := range sess.nodes {
			if oldest == nil || o.seq < oldest.seq {
				oldest = o
			}
		}
		if oldest != n.parent {
			sess.remove(oldest)
		} else {
			// The parent is the oldest: forget it as a node once n has its history.
			defer sess.remove(oldest)
		}
	}
	sess.seq++
	n.seq = sess.seq
	if n.parent != nil {
		n.parent.children = append(n.parent.children, n)
	}
	sess.nodes[n.rid] = n
}

// remove forgets one node; its children stay, as roots.
func (sess *sglangSession) remove(n *sglangNode) {
	if sess.nodes[n.rid] == n {
		delete(sess.nodes, n.rid)
	}
	if p := n.parent; p != nil {
		p.children = slices.DeleteFunc(p.children, func(c *sglangNode) bool { return c == n })
		n.parent = nil
	}
	for _, c := range n.children {
		c.parent = nil
	}
	n.children = nil
}

// clearChildren forgets a node's descendants, as SessionReqNode.clear_children.
func (sess *sglangSession) clearChildren(n *sglangNode) {
	for _, c := range n.children {
		c.parent = nil
		sess.clearChildren(c)
		if sess.nodes[c.rid] == c {
			delete(sess.nodes, c.rid)
		}
	}
	n.children = nil
}

// pyIndex is the end of Python's ids[:i] for ids of n items.
func pyIndex(i, n int) int {
	if i < 0 {
		i += n
	}
	return max(0, min(i, n))
}

// bosOf returns the BOS the encoder adds to a completions text (special tokens added),
// if it adds one.
func bosOf(r *http.Request, encoder tokenize.PromptEncoder) (uint32, bool) {
	yes, no := true, false
	with, err1 := encoder.EncodePrompt(r.Context(), tokenize.Prompt{Text: "a", AddSpecialTokens: &yes})
	without, err2 := encoder.EncodePrompt(r.Context(), tokenize.Prompt{Text: "a", AddSpecialTokens: &no})
	if err1 != nil || err2 != nil || len(with.IDs) != len(without.IDs)+1 || !slices.Equal(with.IDs[1:], without.IDs) {
		return 0, false
	}
	return with.IDs[0], true
}

// writeSGLangAbort answers a request the scheduler aborted with a 400 (FINISH_ABORT,
// BadRequestError): non-streamed, the tokenizer manager raises it as a ValueError (400
// {"error": {"message"}}); streamed, it is the one chunk of a 200, then data: [DONE].
func writeSGLangAbort(w http.ResponseWriter, stream bool, rid string, prompt int, start time.Time, msg string) {
	if !stream {
		writeSGLangError(w, msg)
		return
	}
	b, _ := json.Marshal(map[string]any{"text": "", "output_ids": []uint32{}, "meta_info": map[string]any{
		"id": rid, "prompt_tokens": prompt, "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
		"completion_tokens": 0, "cached_tokens": 0, "e2e_latency": time.Since(start).Seconds(),
		"response_sent_to_client_ts": float64(time.Now().UnixNano()) / 1e9,
		"finish_reason":              map[string]any{"type": "abort", "message": msg, "status_code": http.StatusBadRequest, "err_type": "BadRequestError"},
	}})
	w.Header().Set("content-type", "text/event-stream; charset=utf-8")
	writeSSE(w, b)
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// readSGLangObject reads a control endpoint's body, a JSON object (FastAPI reads one
// from a GET too); a missing or other body is a validation error.
func readSGLangObject(w http.ResponseWriter, r *http.Request, what string) (map[string]json.RawMessage, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	var fields map[string]json.RawMessage
	if err != nil || json.Unmarshal(body, &fields) != nil || fields == nil {
		writeSGLangValidationError(w, "the body is not a JSON object: "+what)
		return nil, false
	}
	return fields, true
}

// serveSGLangOpenSession serves /open_session: 200 and the session's id as a JSON
// string (the body's session_id, else a new uuid4 hex), or SGLang's 400 when that id
// is open already.
func (s *Server) serveSGLangOpenSession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("x-served-by", s.cfg.Name)
	fields, ok := readSGLangObject(w, r, "an OpenSessionReqInput")
	if !ok {
		return
	}
	var capacity float64
	if raw, ok := fields["capacity_of_str_len"]; !ok {
		writeSGLangValidationError(w, "capacity_of_str_len: Field required")
		return
	} else if json.Unmarshal(raw, &capacity) != nil || capacity != math.Trunc(capacity) {
		writeSGLangValidationError(w, "capacity_of_str_len: Input should be a valid integer")
		return
	}
	var id *string
	var streaming *bool
	var timeout *float64
	for key, v := range map[string]any{"session_id": &id, "streaming": &streaming, "timeout": &timeout} {
		if raw, ok := fields[key]; ok && json.Unmarshal(raw, v) != nil {
			writeSGLangValidationError(w, fmt.Sprintf("%s: Input should be a valid %s", key, map[string]string{"session_id": "string", "streaming": "boolean", "timeout": "number"}[key]))
			return
		}
	}
	if id == nil {
		sid := s.sglangUUID()
		id = &sid
	}
	if !s.sessions.openSession(*id, streaming != nil && *streaming) {
		writeSGLangError(w, sglangOpenFailed)
		return
	}
	b, _ := json.Marshal(*id)
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(b)
}

// serveSGLangCloseSession serves /close_session: 200 with an empty body, whether or
// not the session was open (SGLang logs an unknown one).
func (s *Server) serveSGLangCloseSession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("x-served-by", s.cfg.Name)
	fields, ok := readSGLangObject(w, r, "a CloseSessionReqInput")
	if !ok {
		return
	}
	var id *string
	if raw, ok := fields["session_id"]; !ok {
		writeSGLangValidationError(w, "session_id: Field required")
		return
	} else if json.Unmarshal(raw, &id) != nil || id == nil {
		writeSGLangValidationError(w, "session_id: Input should be a valid string")
		return
	}
	s.sessions.closeSession(*id)
	w.WriteHeader(http.StatusOK)
}
