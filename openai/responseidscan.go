package openai

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON scan of a ResponseIDReader: a whole body, or the data of a stream's first
// event.

// found is what a scan has found of a value it looks for.
type found uint8

const (
	unseen found = iota
	good         // a valid id
	bad          // present, but not a valid id
)

type typeState uint8

const (
	typeUnseen typeState = iota
	typeCreated
	typeOther
)

// role is what a value is to the scan: one it looks for, or none.
type role uint8

const (
	roleNone     role = iota
	roleTopID         // the top-level "id"
	roleType          // the top-level "type"
	roleResponse      // the top-level "response"
	roleRespID        // the top-level "response" object's "id"
)

// expectation is what the JSON grammar allows next, whitespace aside.
type expectation uint8

const (
	expValue        expectation = iota
	expValueOrClose             // after '['
	expKeyOrClose               // after '{'
	expKey                      // after ',' in an object
	expColon
	expCommaOrClose
	expEnd // the top-level value is complete
)

// idScanner reads JSON byte by byte, keeping the nesting and the grammar's state, and
// the text of the few strings it looks for: the keys at the top level and in the
// top-level "response" object, and the values of the top-level "id" and "type" and of
// the response's "id". The top-level value must be an object.
type idScanner struct {
	depth  int
	arrays []uint64 // bit d-1 is set when the container at depth d is an array
	next   expectation
	failed bool // not JSON
	closed bool // the top-level value is complete
	// news: a value the scan looks for, or failed or closed, has just been set; feed
	// stops there, for the reader to decide before reading on.
	news bool

	// The string being read.
	inString  bool
	isKey     bool
	capturing bool
	role      role  // a value's role
	esc       uint8 // 0; 1 after a backslash; 2–5 at the hex digits of a \u escape
	hex       rune
	high      rune // a \u escape's high surrogate, awaiting its low half
	buf       []byte
	limit     int
	spoilt    bool // the kept text is over its limit or holds a lone surrogate
	inScalar  bool // a number, true, false or null

	// The roles of the values of the members being read at the top level and in the
	// top-level "response" object, from their keys.
	topKey, respKey role
	// inResponse: the container at depth 2 is the top-level "response" object.
	inResponse bool

	topID, respID         found
	topIDText, respIDText string // when found good
	typ                   typeState
	respSeen              bool
}

// keyLimit is the longest key the scan compares, "response".
const keyLimit = len("response")

// feed reads b, which holds no CR or LF of an event stream's line ends, up to the byte
// that sets news, and returns how many bytes it read.
func (s *idScanner) feed(b []byte) int {
	s.news = false
	for i := 0; i < len(b); i++ {
		if s.inString && !s.capturing && s.esc == 0 {
			// Most of a long body is the text of strings nobody reads (instructions,
			// output text, tools' descriptions): skip it in runs.
			for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
				i++
			}
			if i == len(b) {
				break
			}
		}
		s.step(b[i])
		if s.news {
			s.news = false
			return i + 1
		}
	}
	return len(b)
}

func (s *idScanner) fail() { s.failed, s.news = true, true }

func (s *idScanner) step(c byte) {
	if s.failed {
		return
	}
	if s.inString {
		s.stringByte(c)
		return
	}
	if s.inScalar {
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '+' || c == '-' || c == '.' {
			return
		}
		s.inScalar = false
		s.valueDone()
	}
	switch c {
	case ' ', '\t', '\n', '\r':
		return
	}
	switch s.next {
	case expValue, expValueOrClose:
		if c == ']' && s.next == expValueOrClose {
			s.close(c)
			return
		}
		s.beginValue(c)
	case expKeyOrClose, expKey:
		switch {
		case c == '}' && s.next == expKeyOrClose:
			s.close(c)
		case c == '"':
			capture := s.depth == 1 || s.depth == 2 && s.inResponse
			s.beginString(true, roleNone, capture, keyLimit)
		default:
			s.fail()
		}
	case expColon:
		if c != ':' {
			s.fail()
			return
		}
		s.next = expValue
	case expCommaOrClose:
		switch c {
		case ',':
			if s.inArray() {
				s.next = expValue
			} else {
				s.next = expKey
			}
		case '}', ']':
			s.close(c)
		default:
			s.fail()
		}
	default: // expEnd: something after the top-level value
		s.fail()
	}
}

func (s *idScanner) inArray() bool {
	d := s.depth - 1
	return s.arrays[d/64]&(1<<(d%64)) != 0
}

func (s *idScanner) beginValue(c byte) {
	if s.depth == 0 && c != '{' {
		s.fail() // not an object
		return
	}
	r := roleNone
	switch {
	case s.depth == 1:
		r = s.topKey
	case s.depth == 2 && s.inResponse:
		r = s.respKey
	}
	switch {
	case c == '"':
		switch r {
		case roleTopID, roleRespID:
			s.beginString(false, r, true, MaxResponseIDBytes)
		case roleType:
			s.beginString(false, r, true, len("response.created"))
		default:
			s.notString(r)
			s.beginString(false, roleNone, false, 0)
		}
	case c == '{' || c == '[':
		if r == roleResponse && c == '{' {
			s.respSeen = true
			s.inResponse, s.respKey = true, roleNone
		} else {
			s.notString(r)
		}
		s.open(c)
	case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
		s.notString(r)
		s.inScalar = true
	default:
		s.fail()
	}
}

// notString records that a value with role r is of the wrong kind.
func (s *idScanner) notString(r role) {
	if r != roleNone {
		s.news = true
	}
	switch r {
	case roleTopID:
		s.topID = bad
	case roleType:
		s.typ = typeOther
	case roleResponse:
		s.respSeen, s.respID = true, bad
	case roleRespID:
		s.respID = bad
	}
}

func (s *idScanner) open(c byte) {
	d := s.depth
	s.depth++
	if d/64 == len(s.arrays) {
		s.arrays = append(s.arrays, 0)
	}
	if c == '[' {
		s.arrays[d/64] |= 1 << (d % 64)
		s.next = expValueOrClose
	} else {
		s.arrays[d/64] &^= 1 << (d % 64)
		s.next = expKeyOrClose
	}
}

func (s *idScanner) close(c byte) {
	if s.inArray() != (c == ']') {
		s.fail()
		return
	}
	if s.depth == 2 && s.inResponse {
		s.inResponse = false
		if s.respID == unseen { // the response has no id
			s.respID, s.news = bad, true
		}
	}
	s.depth--
	s.valueDone()
}

func (s *idScanner) valueDone() {
	if s.depth == 0 {
		s.closed, s.next, s.news = true, expEnd, true
		return
	}
	s.next = expCommaOrClose
}

func (s *idScanner) beginString(key bool, r role, capture bool, limit int) {
	s.inString, s.isKey, s.role, s.capturing, s.limit = true, key, r, capture, limit
	s.esc, s.high, s.spoilt, s.buf = 0, 0, false, s.buf[:0]
}

func (s *idScanner) stringByte(c byte) {
	switch {
	case s.esc == 1:
		s.esc = 0
		switch c {
		case '"', '\\', '/':
			s.put(c)
		case 'b':
			s.put('\b')
		case 'f':
			s.put('\f')
		case 'n':
			s.put('\n')
		case 'r':
			s.put('\r')
		case 't':
			s.put('\t')
		case 'u':
			s.esc, s.hex = 2, 0
		default:
			s.fail()
		}
	case s.esc > 1:
		var h byte
		switch {
		case c >= '0' && c <= '9':
			h = c - '0'
		case c >= 'a' && c <= 'f':
			h = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			h = c - 'A' + 10
		default:
			s.fail()
			return
		}
		s.hex = s.hex<<4 | rune(h)
		if s.esc++; s.esc == 6 {
			s.esc = 0
			s.putRune(s.hex)
		}
	case c == '\\':
		s.esc = 1
	case c == '"':
		s.endString()
	case c < 0x20:
		s.fail() // a control character in a string
	default:
		s.put(c)
	}
}

// put adds a byte of the string's text (raw bytes of a multi-byte character come one
// at a time; the text's UTF-8 is checked when it is judged).
func (s *idScanner) put(c byte) {
	if !s.capturing || s.spoilt {
		return
	}
	if s.high != 0 || len(s.buf) == s.limit {
		s.spoilt = true
		return
	}
	s.buf = append(s.buf, c)
}

// putRune adds the character of a \u escape, pairing UTF-16 surrogates. A lone
// surrogate spoils the text: an id that is not valid Unicode is no engine's.
func (s *idScanner) putRune(r rune) {
	if !s.capturing || s.spoilt {
		return
	}
	switch {
	case s.high != 0 && utf16.IsSurrogate(r) && r >= 0xDC00:
		r, s.high = utf16.DecodeRune(s.high, r), 0
	case s.high != 0 || utf16.IsSurrogate(r) && r >= 0xDC00:
		s.spoilt = true
		return
	case utf16.IsSurrogate(r):
		s.high = r
		return
	}
	if len(s.buf)+utf8.RuneLen(r) > s.limit {
		s.spoilt = true
		return
	}
	s.buf = utf8.AppendRune(s.buf, r)
}

func (s *idScanner) endString() {
	s.inString = false
	text, ok := s.buf, s.capturing && !s.spoilt && s.high == 0
	if s.isKey {
		r := roleNone
		switch {
		case !ok:
		case s.depth == 1 && string(text) == "id" && s.topID == unseen:
			r = roleTopID
		case s.depth == 1 && string(text) == "type" && s.typ == typeUnseen:
			r = roleType
		case s.depth == 1 && string(text) == "response" && !s.respSeen:
			r = roleResponse
		case s.depth == 2 && s.inResponse && string(text) == "id" && s.respID == unseen:
			r = roleRespID
		}
		switch s.depth {
		case 1:
			s.topKey = r
		case 2:
			s.respKey = r
		}
		s.next = expColon
		return
	}
	if s.role != roleNone {
		s.news = true
	}
	switch s.role {
	case roleTopID:
		s.topID = bad
		if ok && validID(text) {
			s.topID, s.topIDText = good, string(text)
		}
	case roleRespID:
		s.respID = bad
		if ok && validID(text) {
			s.respID, s.respIDText = good, string(text)
		}
	case roleType:
		s.typ = typeOther
		if ok && string(text) == "response.created" {
			s.typ = typeCreated
		}
	}
	s.valueDone()
}

// validID reports whether text is an id kvroute keeps: 1 to MaxResponseIDBytes bytes
// of valid UTF-8 without control characters.
func validID(text []byte) bool {
	if len(text) == 0 || len(text) > MaxResponseIDBytes || !utf8.Valid(text) {
		return false
	}
	for _, r := range string(text) {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
