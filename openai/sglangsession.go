package openai

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// SGLang keeps a session (POST /open_session, then /generate bodies naming it in
// session_params) in the memory of the engine that opened it: each turn's prompt is
// built there from the session's history, and every other engine aborts the turn
// ("session id … does not exist"). kvroute reads the id each engine's /open_session
// answers (SGLangSessionIDReader) and sends the turns and the /close_session naming it
// to that engine.

// MaxSGLangSessionBytes is the longest SGLang session id kvroute reads, in bytes of
// its text: SGLang's are 32 hex digits unless the client names its own. A longer one
// is read as none (the request is routed as one without a session). It is a response
// id's bound: both are ids an engine keeps, checked alike (validID).
const MaxSGLangSessionBytes = MaxResponseIDBytes

// boundedSessionID is a session id field's value as kvroute reads it: a string of 1 to
// MaxSGLangSessionBytes bytes; "" for none. Any other value is the engine's to judge
// (SGLang's msgspec refuses it): the request is routed as one without that session.
// A batch's session_params, a list in older SGLangs, gives none: SGLang gave each item
// the same one, and no release handled a list (SessionParams(**list) fails).
func boundedSessionID(v jsonv.Value) string {
	if v.Kind() != jsonv.String || len(v.Str()) == 0 || len(v.Str()) > MaxSGLangSessionBytes {
		return ""
	}
	return v.Str()
}

// lastMember is the value of v's last member named key, as Python's json keeps a key
// given twice; a Null Value when v is not an object or has none.
func lastMember(v jsonv.Value, key string) jsonv.Value {
	var last jsonv.Value
	if v.Kind() != jsonv.Object {
		return last
	}
	for i := range v.Len() {
		if k, value := v.Member(i); k == key {
			last = value
		}
	}
	return last
}

// SGLangCloseSession is SGLang's POST /close_session (its CloseSessionReqInput): the
// request goes to the worker whose engine opened the session it names
// (ParseSGLangSessionControl), since every other engine would only log it as unknown
// and the session would stay open.
const SGLangCloseSession = tokenize.APISGLangCloseSession

// SGLangOpenSession is SGLang's POST /open_session (its OpenSessionReqInput): one
// naming its own session_id (ParseSGLangSessionControl) of a session open on some
// engine goes to that engine, which refuses it as one SGLang refuses a second open of
// an id, rather than to another that would open a second session of that id.
const SGLangOpenSession = tokenize.APISGLangOpenSession

// ParseSGLangSessionControl reads a body of SGLang's POST /open_session or
// /close_session: its session_id, read as a /generate body's session_params.id is
// (Request.SGLangSession; "" when it is not a string of 1 to MaxSGLangSessionBytes
// bytes: the engine judges it, and an open without one gets an id from its engine).
// The body holds no prompt: Tokens is empty (routed by load) and Model "" (the
// caller's to give). Only a body that is not a JSON object, or is nested past the
// limit, is refused (a *FieldError).
func ParseSGLangSessionControl(body []byte, lim Limits) (Request, error) {
	// The body holds nothing else kvroute reads: the reading of a body not parsed.
	session, _, err := ParseSGLangSessions(SGLangCloseSession, body, lim)
	if err != nil {
		return Request{}, err
	}
	return Request{Tokens: []uint32{}, SGLangSession: session}, nil
}

// ParseSGLangSessions reads only the sessions a body of endpoint names, as Parse reads
// them: an SGLangGenerate body's session_params.id (session) and session_id (key), an
// SGLangCloseSession or SGLangOpenSession body's session_id (session). The body's syntax is checked as
// ParseModel checks it, and no other field is kept, nor any object or list
// materialised: it is what a body routed by load without being parsed
// (max_concurrent_body_bytes) needs, since its session still names the one engine that
// can serve it.
func ParseSGLangSessions(endpoint Endpoint, body []byte, lim Limits) (session, key string, err error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return "", "", err
	}
	dec.SetValueBudget(0) // a field that is not a scalar is none: nothing to materialise
	var id, sessionKey jsonv.Value
	err = readObject(dec, lim, func(name string) error {
		var err error
		switch {
		case (endpoint == SGLangCloseSession || endpoint == SGLangOpenSession) && name == "session_id":
			id, err = scalarField(dec)
		case endpoint == SGLangGenerate && name == "session_id":
			sessionKey, err = scalarField(dec)
		case endpoint == SGLangGenerate && name == "session_params":
			// The last session_params counts, and in it the last id (lastMember).
			id = jsonv.Value{}
			if k, err := dec.Peek(); err != nil || k != jsonv.Object {
				return dec.Skip()
			}
			err = dec.Members(func(member string) error {
				if member != "id" {
					return dec.Skip()
				}
				var err error
				id, err = scalarField(dec)
				return err
			})
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return "", "", err
	}
	if endpoint == SGLangGenerate {
		key = boundedSessionID(sessionKey)
	}
	return boundedSessionID(id), key, nil
}

// SGLangSessionIDReader reads the id of the session an SGLang engine opened from the
// body of its /open_session answer, as Envoy streams it: FastAPI writes the id the
// handler returns as a bare JSON string (`"3f2a…"`). It keeps at most the bytes such a
// string of MaxSGLangSessionBytes takes written with escapes, and decides as soon as
// the string is closed. The id must be 1 to MaxSGLangSessionBytes bytes of valid UTF-8
// without control characters (it comes from an engine and goes into a map and logs);
// any other body (an error object, a cut string) has no id.
//
// The zero value is ready to use; a reader reads one body and is not safe for
// concurrent use. It is up to the caller to feed it only the bodies of successful
// responses (HTTP 200).
type SGLangSessionIDReader struct {
	body []byte
	done bool
	id   string
}

// maxSGLangSessionAnswer bounds what SGLangSessionIDReader keeps: the quotes, each byte
// of the id as a \u escape at worst, and some whitespace around.
const maxSGLangSessionAnswer = 2 + 6*MaxSGLangSessionBytes + 64

// Write reads the next chunk of the body. It returns the id once found (done true), or
// done true with "" once the body cannot carry one; until then "", false. A body that
// ends before the reader is done has no id. chunk is not kept.
func (r *SGLangSessionIDReader) Write(chunk []byte) (id string, done bool) {
	if r.done {
		return r.id, true
	}
	if room := maxSGLangSessionAnswer - len(r.body); len(chunk) > room {
		chunk = chunk[:room]
	}
	r.body = append(r.body, chunk...)
	text := r.body
	for len(text) > 0 && (text[0] == ' ' || text[0] == '\t' || text[0] == '\n' || text[0] == '\r') {
		text = text[1:]
	}
	switch {
	case len(text) == 0:
		return r.undecided()
	case text[0] != '"':
		return r.finish("")
	}
	for i := 1; i < len(text); i++ {
		switch text[i] {
		case '\\':
			i++ // the escaped byte, whatever it is, does not close the string
		case '"':
			return r.finish(sessionIDOf(text[:i+1]))
		}
	}
	return r.undecided()
}

// undecided is Write's answer while the string is open: the body may still close it,
// unless the bound is reached.
func (r *SGLangSessionIDReader) undecided() (string, bool) {
	if len(r.body) >= maxSGLangSessionAnswer {
		return r.finish("")
	}
	return "", false
}

func (r *SGLangSessionIDReader) finish(id string) (string, bool) {
	r.done, r.id, r.body = true, id, nil
	return id, true
}

// sessionIDOf is the id a closed JSON string gives, "" when it is not one
// SGLangSessionIDReader takes: a response id's rules (validID), and no U+FFFD, which
// is what encoding/json makes of a lone surrogate escape (ResponseIDReader refuses
// those too).
func sessionIDOf(quoted []byte) string {
	var id string
	if !utf8.Valid(quoted) || json.Unmarshal(quoted, &id) != nil || strings.ContainsRune(id, utf8.RuneError) || !validID([]byte(id)) {
		return ""
	}
	return id
}
