package filter

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// cutShort reports whether body ends inside a JSON document: it is a proper prefix of
// one (more bytes could complete it), not a whole one or a malformed one. A body cut at
// a gateway's buffer limit is always cut short, as a JSON document ends with its last
// value; a malformed body is left to the request parser, which names the fault. A UTF-8
// byte order mark at the start is skipped, as the request parser skips it.
func cutShort(body []byte) bool {
	err := json.Unmarshal(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")), &discard{})
	if errors.Is(err, io.ErrUnexpectedEOF) { // encoding/json's v2 implementation
		return true
	}
	var syntax *json.SyntaxError
	return errors.As(err, &syntax) && syntax.Error() == "unexpected end of JSON input"
}

// discard takes any JSON value and keeps nothing: json.Unmarshal checks the syntax of
// the whole input before it calls UnmarshalJSON, so nothing is copied.
type discard struct{}

// UnmarshalJSON keeps nothing.
func (discard) UnmarshalJSON([]byte) error { return nil }
