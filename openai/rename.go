package openai

import (
	"bytes"
	"encoding/json"
)

// A ModelRenamer rewrites a response body as it streams through, chunk by chunk, so
// that the value of its top-level "model" member names the model the client asked for
// where the engine wrote the one the request was rewritten to (GIE's endpoint picker
// does the same since its #2769). Only a member named "model" whose value is a JSON
// string equal to the target is replaced (compared decoded, so escapes do not hide it),
// and only at the top level or as a member of the object that is the value of a
// top-level member named "message" (where an Anthropic Messages stream's message_start
// event names its model); the same name anywhere else (generated text, a nested object,
// deeper in a message, an error's message) and every other byte stay as they came.
//
// The body is one JSON value, or with events set an SSE stream whose data lines each
// hold one (a chat.completion.chunk, a text_completion, an error event): each data line
// is read as a document of its own, and other lines (comments, event names, [DONE])
// pass untouched. A data value split over several data lines of one event is not
// renamed.
//
// A model value cut by a chunk boundary is held back, and only while it may still be
// the target: it goes out (renamed or not) with the chunk that completes it, or, as it
// came, with the last chunk. A renamer holds at most 6 bytes per byte of the target's
// name, plus its quotes. It is for one body, used by one goroutine.
type ModelRenamer struct {
	target string // the name to replace, decoded
	to     []byte // the client's name, as a JSON string with its quotes
	// maxHeld is the longest JSON string whose value can be target: each byte written
	// as a \u00XX escape, and the quotes.
	maxHeld int
	events  bool

	// SSE: where the current line is.
	line   lineState
	fieldN int // bytes of "data" read at the start of the line

	// JSON: depth of nesting, whether in a string (and after its backslash), whether
	// the value at depth 1 is an object, whether the value at depth 2 is the object
	// of a top-level "message" member, and what the scanner expects of either object.
	depth             int
	inString, escaped bool
	topObject         bool
	inMessage         bool
	expectKey         bool
	member            memberState
	// key holds the raw bytes of a member name at depth 1 (or of the message object's,
	// at depth 2) as read so far; keyN of them, or -1 once the name is too long to be
	// "model" or "message".
	key  [maxKeyBytes]byte
	keyN int

	// holding: reading a string after a "model" key; held has its bytes of
	// earlier chunks (from its opening quote), heldN all of them so far, and heldEsc
	// says it has an escape (it is then compared decoded, when it closes).
	holding bool
	held    []byte
	heldN   int
	heldEsc bool

	out []byte
}

type lineState uint8

const (
	lineField lineState = iota // reading the field name at the start of a line
	lineData                   // in the value of a data field
	lineOther                  // in any other line
)

type memberState uint8

const (
	memberNone         memberState = iota
	memberKey                      // reading a member name (of the top object or the message's)
	memberColon                    // after the name "model": expecting its colon
	memberValue                    // after that colon: expecting its value
	memberMessageColon             // after a top-level name "message": expecting its colon
	memberMessageValue             // after that colon: expecting its value
)

// maxKeyBytes is the longest raw member name that can spell "message" (every letter a
// \u escape).
const maxKeyBytes = 7 * 6

// NewModelRenamer returns a renamer of target to requested in one response body; events
// says the body is an SSE stream (content-type text/event-stream), else one JSON value.
func NewModelRenamer(target, requested string, events bool) *ModelRenamer {
	to, _ := json.Marshal(requested) // a string always marshals
	return &ModelRenamer{target: target, to: to, maxHeld: 6*len(target) + 2, events: events}
}

// Rename takes the body's next chunk and returns the bytes to send in its place; final
// says no more of the body follows (the rest held back is then returned as it came:
// Rename(nil, true) flushes). changed is false when out is chunk itself; otherwise out
// is the renamer's, valid until the next call. chunk is not modified or kept.
func (r *ModelRenamer) Rename(chunk []byte, final bool) (out []byte, changed bool) {
	s := renaming{r: r, chunk: chunk, out: r.out[:0]}
	if r.holding && len(r.held) > 0 {
		// The held bytes go out in this chunk's place, renamed or not.
		s.copying = true
	}
	for i := 0; i < len(chunk); {
		i = s.step(i)
	}
	if r.holding {
		if final {
			s.release()
			r.holding = false
		} else {
			s.startCopying()
			r.held = append(r.held, chunk[s.flushed:]...)
			s.flushed = len(chunk)
		}
	}
	s.emit(len(chunk))
	r.out = s.out
	if !s.copying {
		return chunk, false
	}
	return s.out, true
}

// renaming is one Rename call: chunk[:flushed] is accounted for, copied to out once
// copying (the output differs from chunk), else passed as it is.
type renaming struct {
	r       *ModelRenamer
	chunk   []byte
	out     []byte
	flushed int
	copying bool
}

func (s *renaming) emit(upto int) {
	if s.copying {
		s.out = append(s.out, s.chunk[s.flushed:upto]...)
	}
	s.flushed = upto
}

func (s *renaming) startCopying() {
	if !s.copying {
		s.copying = true
		s.out = append(s.out, s.chunk[:s.flushed]...)
	}
}

// release ends a hold whose string is not the target: its bytes of earlier chunks go
// out now, and those of this chunk (from flushed) pass with what follows.
func (s *renaming) release() {
	r := s.r
	if len(r.held) > 0 {
		s.out = append(s.out, r.held...)
		r.held = r.held[:0]
	}
	r.holding = false
}

// replace ends a hold whose string, closed at chunk[end-1], is the target.
func (s *renaming) replace(end int) {
	r := s.r
	s.startCopying()
	s.out = append(s.out, r.to...)
	s.flushed = end
	r.held = r.held[:0]
	r.holding = false
}

const (
	stringStops    = "\"\\"
	stringStopsSSE = "\"\\\r\n"
)

// step reads chunk[i] (or a run of bytes nothing depends on) and returns where to go on.
func (s *renaming) step(i int) int {
	r, c := s.r, s.chunk[i]
	if r.events {
		if c == '\n' || c == '\r' {
			// A line ends: a data line's document with it.
			if r.holding {
				s.release()
			}
			r.line, r.fieldN = lineField, 0
			r.resetJSON()
			return i + 1
		}
		switch r.line {
		case lineField:
			switch {
			case r.fieldN < 4 && c == "data"[r.fieldN]:
				r.fieldN++
			case r.fieldN == 4 && c == ':':
				r.line = lineData
			default:
				r.line = lineOther
			}
			return i + 1
		case lineOther:
			if j := bytes.IndexAny(s.chunk[i:], "\r\n"); j >= 0 {
				return i + j
			}
			return len(s.chunk)
		}
	}
	if r.holding {
		return s.stepHeld(i)
	}
	if r.inString {
		switch {
		case r.escaped:
			r.escaped = false
			if r.member == memberKey {
				r.appendKey(c)
			}
			return i + 1
		case c == '\\':
			r.escaped = true
			if r.member == memberKey {
				r.appendKey(c)
			}
			return i + 1
		case c == '"':
			r.inString = false
			if r.member == memberKey {
				r.member = r.keyMember()
			}
			return i + 1
		case r.member == memberKey:
			r.appendKey(c)
			return i + 1
		}
		// String content nothing depends on: skip to the next quote or backslash.
		stops := stringStops
		if r.events {
			stops = stringStopsSSE
		}
		if j := bytes.IndexAny(s.chunk[i:], stops); j >= 0 {
			return i + j
		}
		return len(s.chunk)
	}
	switch c {
	case ' ', '\t', '\n', '\r':
		return i + 1
	case '"':
		r.inString = true
		switch {
		case r.member == memberValue:
			// The value of a "model" member: hold it while it may be the target.
			s.emit(i)
			r.holding, r.heldN, r.heldEsc = true, 1, false
			r.member = memberNone
		case r.expectKey && (r.depth == 1 && r.topObject || r.depth == 2 && r.inMessage):
			r.member, r.keyN = memberKey, 0
		default:
			r.member = memberNone
		}
		return i + 1
	case ':':
		if r.depth == 1 || r.depth == 2 && r.inMessage {
			r.expectKey = false
			switch r.member {
			case memberColon:
				r.member = memberValue
				return i + 1
			case memberMessageColon:
				r.member = memberMessageValue
				return i + 1
			}
		}
	case ',':
		if r.depth == 1 && r.topObject || r.depth == 2 && r.inMessage {
			r.expectKey = true
		}
	case '{', '[':
		r.depth++
		switch {
		case r.depth == 1:
			r.topObject, r.expectKey = c == '{', c == '{'
		case c == '{' && r.member == memberMessageValue:
			// The value of a top-level "message" (depth 2): its members are read.
			r.inMessage, r.expectKey = true, true
		}
	case '}', ']':
		if r.depth > 0 {
			r.depth--
		}
		if r.depth == 1 && r.inMessage {
			// Back at the top level after message's value, as after any other.
			r.inMessage, r.expectKey = false, false
		}
	}
	r.member = memberNone
	return i + 1
}

// stepHeld reads chunk[i] inside a held model value.
func (s *renaming) stepHeld(i int) int {
	r, c := s.r, s.chunk[i]
	switch {
	case r.escaped:
		r.escaped = false
	case c == '\\':
		r.escaped, r.heldEsc = true, true
	case c == '"':
		r.inString = false
		var match bool
		if r.heldEsc {
			raw, n := s.chunk[s.flushed:i+1], len(r.held)
			if n > 0 {
				r.held = append(r.held, raw...)
				raw = r.held
			}
			var v string
			match = json.Unmarshal(raw, &v) == nil && v == r.target
			r.held = r.held[:n]
		} else {
			match = r.heldN-1 == len(r.target)
		}
		if match {
			s.replace(i + 1)
		} else {
			s.release()
		}
		return i + 1
	case !r.heldEsc && (r.heldN-1 >= len(r.target) || c != r.target[r.heldN-1]):
		// Not the target: the string goes on as any other.
		s.release()
		return i
	}
	r.heldN++
	if r.heldN > r.maxHeld {
		s.release()
	}
	return i + 1
}

func (r *ModelRenamer) appendKey(c byte) {
	if r.keyN >= 0 && r.keyN < maxKeyBytes {
		r.key[r.keyN] = c
		r.keyN++
	} else {
		r.keyN = -1
	}
}

// keyMember returns what follows the member name just read: memberColon after
// "model", memberMessageColon after "message" at the top level, else memberNone.
func (r *ModelRenamer) keyMember() memberState {
	if r.keyN < 0 {
		return memberNone
	}
	key := r.key[:r.keyN]
	var model, message bool
	if bytes.IndexByte(key, '\\') < 0 {
		model, message = string(key) == "model", string(key) == "message"
	} else {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return memberNone
		}
		model, message = k == "model", k == "message"
	}
	switch {
	case model:
		return memberColon
	case message && r.depth == 1:
		return memberMessageColon
	}
	return memberNone
}

func (r *ModelRenamer) resetJSON() {
	r.depth, r.inString, r.escaped, r.topObject, r.inMessage, r.expectKey, r.member = 0, false, false, false, false, false, memberNone
}
