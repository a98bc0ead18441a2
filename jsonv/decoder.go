package jsonv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrTooDeep is wrapped by the error for input nested deeper than the decoder's limit.
var ErrTooDeep = errors.New("nested too deeply")

// SyntaxError reports malformed input and where it is.
type SyntaxError struct {
	// Offset is the byte offset in the input where the problem was found.
	Offset int
	Msg    string
	err    error
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// Unwrap returns ErrTooDeep for nesting errors.
func (e *SyntaxError) Unwrap() error { return e.err }

// Decoder reads one JSON document from a byte slice, value by value. Callers walk
// objects and arrays with [Decoder.Members] and [Decoder.Elements] and consume each value
// they meet with exactly one of Value, Skip, String or AppendUint32s, so that only what
// they need is materialised. Nesting beyond the depth limit is an error wrapping
// [ErrTooDeep]; recursion is bounded by that limit, so the goroutine stack is too. A
// Decoder is not safe for concurrent use.
type Decoder struct {
	data     []byte
	pos      int
	depth    int
	maxDepth int
	// budget is what Value may still materialise, in bytes (SetValueBudget).
	budget int
	// nonFinite is whether NaN, Infinity and -Infinity are numbers (AcceptNonFinite).
	nonFinite bool
	// counts is, during Value, the item count of each non-empty array and object of
	// the value being read, in document order: written by its first pass, read by its
	// second.
	counts itemCounts
}

// NewDecoder returns a decoder of data allowing maxDepth levels of nested arrays and
// objects (a top-level object is depth 1). maxDepth must be positive.
func NewDecoder(data []byte, maxDepth int) *Decoder {
	return &Decoder{data: data, maxDepth: max(1, maxDepth), budget: math.MaxInt}
}

// Parse decodes a whole document, which must be one value and nothing after it.
func Parse(data []byte, maxDepth int) (Value, error) {
	d := NewDecoder(data, maxDepth)
	v, err := d.Value()
	if err != nil {
		return Value{}, err
	}
	return v, d.End()
}

func (d *Decoder) errorf(format string, args ...any) error {
	return &SyntaxError{Offset: d.pos, Msg: fmt.Sprintf(format, args...)}
}

func (d *Decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// Peek returns the kind of the next value without consuming it. At the end of input, or
// before a byte that cannot start a value, it returns an error.
func (d *Decoder) Peek() (Kind, error) {
	d.skipSpace()
	if d.pos >= len(d.data) {
		return Null, d.errorf("unexpected end of input")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return Object, nil
	case c == '[':
		return Array, nil
	case c == '"':
		return String, nil
	case c == 't':
		return True, nil
	case c == 'f':
		return False, nil
	case c == 'n':
		return Null, nil
	case c == '-' || c >= '0' && c <= '9':
		return Number, nil
	case d.nonFinite && (c == 'N' || c == 'I'):
		return Number, nil
	default:
		return Null, d.errorf("unexpected character %q", c)
	}
}

// PeekFirst returns the kind of the next value's first element, which must be an
// array, without consuming anything, and whether the array is empty.
func (d *Decoder) PeekFirst() (first Kind, empty bool, err error) {
	if k, err := d.Peek(); err != nil {
		return Null, false, err
	} else if k != Array {
		return Null, false, d.errorf("expected an array, found %s", k)
	}
	save := d.pos
	defer func() { d.pos = save }()
	d.pos++
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		return Null, true, nil
	}
	first, err = d.Peek()
	return first, false, err
}

// SkipByteOrderMark skips a UTF-8 byte order mark (EF BB BF) at the very start of the
// input, which Python's json.loads drops from bytes it is given (it decodes them as
// "utf-8-sig"), as the engines' FastAPI servers read request bodies. Anywhere else a
// mark is an unexpected character, as it is to Python. Offsets stay the input's.
func (d *Decoder) SkipByteOrderMark() {
	if d.pos == 0 && len(d.data) >= 3 && d.data[0] == 0xef && d.data[1] == 0xbb && d.data[2] == 0xbf {
		d.pos = 3
	}
}

// AcceptNonFinite makes the decoder read NaN, Infinity and -Infinity as numbers, as
// Python's json module does by default (the engines' FastAPI servers read request
// bodies with it): a [Value] of kind Number whose literal is that word, which
// [Value.Float] reads as the float and [Value.Int] and [Value.IsInteger] do not take.
// No other spelling is accepted (nan, Inf, +Infinity and -NaN are errors, as to
// Python). Without a call, the decoder reads RFC 8259's grammar alone.
func (d *Decoder) AcceptNonFinite() { d.nonFinite = true }

// Offset returns the byte offset in the input of what the decoder reads next: after
// Peek, the next value's first byte; after a value is consumed, the byte after it.
func (d *Decoder) Offset() int { return d.pos }

// End checks that nothing but whitespace follows the document.
func (d *Decoder) End() error {
	d.skipSpace()
	if d.pos != len(d.data) {
		return d.errorf("unexpected data after the top-level value")
	}
	return nil
}

func (d *Decoder) enter() error {
	d.depth++
	if d.depth > d.maxDepth {
		return &SyntaxError{Offset: d.pos, Msg: fmt.Sprintf("nested deeper than %d levels", d.maxDepth), err: ErrTooDeep}
	}
	return nil
}

// Members walks an object: for each member it reads the key and calls fn, which must
// consume the member's value. A non-object is an error naming its kind.
func (d *Decoder) Members(fn func(key string) error) error {
	if k, err := d.Peek(); err != nil {
		return err
	} else if k != Object {
		return d.errorf("expected an object, found %s", k)
	}
	if err := d.enter(); err != nil {
		return err
	}
	d.pos++ // {
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		d.depth--
		return nil
	}
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return d.errorf("expected a member name")
		}
		key, err := d.str()
		if err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return d.errorf("expected ':' after a member name")
		}
		d.pos++
		if err := fn(key); err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.errorf("unexpected end of input in an object")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			d.depth--
			return nil
		default:
			return d.errorf("expected ',' or '}' in an object")
		}
	}
}

// Elements walks an array, calling fn with each element's index; fn must consume the
// element. A non-array is an error naming its kind.
func (d *Decoder) Elements(fn func(i int) error) error {
	if k, err := d.Peek(); err != nil {
		return err
	} else if k != Array {
		return d.errorf("expected an array, found %s", k)
	}
	if err := d.enter(); err != nil {
		return err
	}
	d.pos++ // [
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		d.depth--
		return nil
	}
	for i := 0; ; i++ {
		if err := fn(i); err != nil {
			return err
		}
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.errorf("unexpected end of input in an array")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			d.depth--
			return nil
		default:
			return d.errorf("expected ',' or ']' in an array")
		}
	}
}

// Skip consumes the next value, checking its syntax without materialising it: Value's
// first pass (the same errors at the same offsets), which keeps nothing, not even a
// member's name.
func (d *Decoder) Skip() error {
	var m measurement // not recording: it only counts
	return d.measure(&m)
}

// String consumes a string value and returns its text; any other kind is an error.
func (d *Decoder) String() (string, error) {
	if k, err := d.Peek(); err != nil {
		return "", err
	} else if k != String {
		return "", d.errorf("expected a string, found %s", k)
	}
	return d.str()
}

// AppendUint32s consumes an array of integers in [0, 2³²) and appends them to dst,
// without materialising the array. More than limit elements is an error wrapping
// [ErrTooMany]. A non-integer element is an error naming its index, wrapping
// [ErrNotUint32].
func (d *Decoder) AppendUint32s(dst []uint32, limit int) ([]uint32, error) {
	return d.AppendUint32sFunc(dst, limit, nil)
}

// AppendUint32sFunc is [Decoder.AppendUint32s] with convert deciding the elements
// written otherwise than as an integer in range (a sign, a fraction or an exponent, a
// string, true, false or null): each is materialised and passed to convert, whose false
// is an error naming its index. An integer literal out of range, an array and an object
// are errors without it. A nil convert accepts no other element.
//
// Either way the whole array is consumed: after an element error (wrapping
// [ErrNotUint32]) or passing the limit ([ErrTooMany]), the rest is skipped, its syntax
// checked, so that the caller may go on reading the document past the array (a body
// that gives the field again replaces it). A syntax error, even after the first element
// error, is returned instead: the document is malformed.
func (d *Decoder) AppendUint32sFunc(dst []uint32, limit int, convert func(Value) (uint32, bool)) ([]uint32, error) {
	var elemErr error // the first element error; the elements after it are skipped
	err := d.Elements(func(i int) error {
		if elemErr != nil {
			return d.Skip()
		}
		if i >= limit {
			elemErr = &SyntaxError{Offset: d.pos, Msg: fmt.Sprintf("more than %d elements", limit), err: ErrTooMany}
			return d.Skip()
		}
		d.skipSpace()
		start := d.pos
		if n, end, ok := plainUint32(d.data, start); ok {
			dst = append(dst, n)
			d.pos = end
			return nil
		}
		// notUint32 records the element error at the element's offset and skips it.
		notUint32 := func(format string, args ...any) error {
			d.pos = start
			elemErr = &SyntaxError{Offset: start, Msg: fmt.Sprintf(format, args...), err: ErrNotUint32}
			return d.Skip()
		}
		// Only an element that opens a number is read as one here: the other kinds go
		// to convert without building the error of a failed number (an allocation per
		// element, where a body of lax ids is nothing but such elements).
		var lit []byte
		var err error
		if d.pos < len(d.data) && (d.data[d.pos] == '-' || d.data[d.pos] >= '0' && d.data[d.pos] <= '9') {
			lit, err = d.number()
		} else {
			err = errOtherKind
		}
		switch {
		case err == nil && (isDigits(lit) || convert == nil):
			// Digits alone that plainUint32 did not take are out of range (or a "0"
			// before another digit, which the array's syntax refuses next).
			return notUint32("element %d: expected an integer in [0, 2^32), got %s", i, lit)
		case convert == nil:
			return notUint32("element %d: expected an integer in [0, 2^32)", i)
		}
		d.pos = start
		k, err := d.Peek()
		if err != nil {
			return err
		}
		if k == Array || k == Object {
			return notUint32("element %d: expected an integer in [0, 2^32), found %s", i, k)
		}
		v, err := d.Scalar() // no larger than its bytes of input: outside the budget
		if err != nil {
			return err
		}
		n, ok := convert(v)
		if !ok {
			return notUint32("element %d: expected an integer in [0, 2^32), got %s", i, brief(v))
		}
		dst = append(dst, n)
		return nil
	})
	if err != nil {
		return dst, err
	}
	return dst, elemErr
}

// plainUint32 reads the integer literal at data[start:] when it is one in [0, 2³²)
// written as digits alone, without a leading zero before another digit, and is followed
// by no fraction, exponent or further digit: the element of nearly every array of
// token ids, read here without the general number grammar and strconv. Any other
// element (false ok) is left to the general path, which reads it or names its fault.
func plainUint32(data []byte, start int) (n uint32, end int, ok bool) {
	const maxDigits = 10 // 4294967295
	var v uint64
	p := start
	for p < len(data) && p-start < maxDigits+1 && data[p] >= '0' && data[p] <= '9' {
		v = v*10 + uint64(data[p]-'0')
		p++
	}
	switch digits := p - start; {
	case digits == 0 || digits > maxDigits || v > math.MaxUint32:
		return 0, 0, false
	case digits > 1 && data[start] == '0': // "01": not JSON
		return 0, 0, false
	}
	if p < len(data) && (data[p] == '.' || data[p] == 'e' || data[p] == 'E') {
		return 0, 0, false
	}
	return uint32(v), p, true
}

// isDigits reports whether a number literal is an integer without a sign.
func isDigits(lit []byte) bool {
	for _, c := range lit {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// brief is v as JSON for an error message, cut to 40 bytes.
func brief(v Value) string {
	b := v.AppendCompact(nil)
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// EveryElementIs reports whether every element of the next value, an array, is of kind
// k (true for an empty array), without consuming anything. Its error is the syntax
// error reading the array would meet.
func (d *Decoder) EveryElementIs(k Kind) (bool, error) {
	savePos, saveDepth := d.pos, d.depth
	defer func() { d.pos, d.depth = savePos, saveDepth }()
	err := d.Elements(func(int) error {
		if got, err := d.Peek(); err != nil {
			return err
		} else if got != k {
			return errOtherKind
		}
		return d.Skip()
	})
	if err == errOtherKind {
		return false, nil
	}
	return err == nil, err
}

// errOtherKind stops EveryElementIs at the first element of another kind.
var errOtherKind = errors.New("an element of another kind")

// ErrTooMany is wrapped by AppendUint32s's error for an array over its limit.
var ErrTooMany = errors.New("too many elements")

// ErrNotUint32 is wrapped by AppendUint32s's error for an element that is not an
// integer in [0, 2³²) (nor one convert takes).
var ErrNotUint32 = errors.New("an element that is not a uint32")

func (d *Decoder) literal(k Kind) error {
	word := kindNames[k]
	if len(d.data)-d.pos < len(word) || string(d.data[d.pos:d.pos+len(word)]) != word {
		return d.errorf("invalid literal")
	}
	d.pos += len(word)
	return nil
}

// number consumes a number and returns its literal, checked against JSON's grammar.
func (d *Decoder) number() ([]byte, error) {
	start, p := d.pos, d.pos
	digits := func() int {
		n := 0
		for p < len(d.data) && d.data[p] >= '0' && d.data[p] <= '9' {
			p++
			n++
		}
		return n
	}
	if p < len(d.data) && d.data[p] == '-' {
		p++
	}
	if d.nonFinite && p < len(d.data) && (d.data[p] == 'N' || d.data[p] == 'I') {
		word := "Infinity"
		if d.data[p] == 'N' {
			word = "NaN"
		}
		if p > start && word == "NaN" || !bytes.HasPrefix(d.data[p:], []byte(word)) {
			d.pos = p
			return nil, d.errorf("invalid number")
		}
		d.pos = p + len(word)
		return d.data[start:d.pos], nil
	}
	if p < len(d.data) && d.data[p] == '0' {
		p++
	} else if digits() == 0 {
		d.pos = p
		return nil, d.errorf("invalid number")
	}
	if p < len(d.data) && d.data[p] == '.' {
		p++
		if digits() == 0 {
			d.pos = p
			return nil, d.errorf("invalid number: no digits after '.'")
		}
	}
	if p < len(d.data) && (d.data[p] == 'e' || d.data[p] == 'E') {
		p++
		if p < len(d.data) && (d.data[p] == '+' || d.data[p] == '-') {
			p++
		}
		if digits() == 0 {
			d.pos = p
			return nil, d.errorf("invalid number: no digits in the exponent")
		}
	}
	d.pos = p
	return d.data[start:p], nil
}

// str consumes a string (the decoder is at its opening quote) and returns its text.
func (d *Decoder) str() (string, error) {
	start := d.pos + 1
	// Fast path: no escapes, so the text is the bytes between the quotes.
	if p := start + plainRun(d.data[start:]); p < len(d.data) && d.data[p] == '"' {
		if !utf8.Valid(d.data[start:p]) {
			d.pos = start
			return "", d.errorf("invalid UTF-8 in a string")
		}
		d.pos = p + 1
		return string(d.data[start:p]), nil
	}
	// Escapes: the text is never longer than the string as written, so it is built in
	// one allocation of that size, runs without escapes copied whole.
	var b strings.Builder
	b.Grow(rawLength(d.data[start:]))
	d.pos = start
	for d.pos < len(d.data) {
		run := d.pos
		d.pos += plainRun(d.data[d.pos:])
		b.Write(d.data[run:d.pos])
		if d.pos == len(d.data) {
			break
		}
		switch c := d.data[d.pos]; {
		case c == '"':
			d.pos++
			text := b.String()
			if !utf8.ValidString(text) {
				return "", d.errorf("invalid UTF-8 in a string")
			}
			return text, nil
		case c == '\\':
			if d.pos+1 < len(d.data) {
				if e := simpleEscapes[d.data[d.pos+1]]; e != 0 {
					b.WriteByte(e)
					d.pos += 2
					continue
				}
			}
			r, err := d.escape()
			if err != nil {
				return "", err
			}
			b.WriteRune(r)
		default:
			return "", d.errorf("control character in a string")
		}
	}
	return "", d.errorf("unterminated string")
}

// Word-at-a-time scanning: a string body is mostly plain bytes, and chat messages are
// kilobytes long, so it is read eight bytes per step (the usual SWAR tests: a byte of
// x is zero where (x-0x01..)&^x has its high bit set; borrows only ever add false hits
// above a true one, so "does the word hold one" is exact).
const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// bytesBelow returns a word with the high bit set in the bytes of x below n (n <=
// 0x80); exact for the lowest such byte, and 0 when there is none.
func bytesBelow(x, n uint64) uint64 { return (x - lowBits*n) &^ x & highBits }

// bytesEqual returns a word with the high bit set in the bytes of x equal to c; exact
// for the lowest such byte, and 0 when there is none.
func bytesEqual(x uint64, c byte) uint64 { return bytesBelow(x^(lowBits*uint64(c)), 1) }

// firstMarked returns the index of the lowest byte of a marked word (from bytesBelow,
// bytesEqual or their union, whose lowest mark is always a true one).
func firstMarked(m uint64) int { return bits.TrailingZeros64(m) / 8 }

// plainRun is the length of the run at the start of b that needs no decoding: up to
// the first quote, backslash or control character (all of b if there is none).
func plainRun(b []byte) int {
	p := 0
	for ; p+8 <= len(b); p += 8 {
		x := binary.LittleEndian.Uint64(b[p:])
		if m := bytesEqual(x, '"') | bytesEqual(x, '\\') | bytesBelow(x, 0x20); m != 0 {
			return p + firstMarked(m)
		}
	}
	for ; p < len(b); p++ {
		if c := b[p]; c == '"' || c == '\\' || c < 0x20 {
			return p
		}
	}
	return p
}

// rawLength is the length of the string body at the start of b, up to its closing
// quote (all of b if there is none): an escape's second byte is never the closing quote.
func rawLength(b []byte) int {
	p := 0
	for p < len(b) {
		if p+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[p:])
			m := bytesEqual(x, '"') | bytesEqual(x, '\\')
			if m == 0 {
				p += 8
				continue
			}
			p += firstMarked(m)
		}
		switch b[p] {
		case '"':
			return p
		case '\\':
			p++
		}
		p++
	}
	return len(b)
}

// simpleEscapes maps the byte after a backslash to the byte it stands for, for the
// escapes of one byte (0 for \u and invalid escapes). Never written.
var simpleEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escape consumes one escape sequence and returns the rune it stands for. A lone UTF-16
// surrogate becomes U+FFFD, as Go's encoding/json decodes it.
func (d *Decoder) escape() (rune, error) {
	if d.pos+1 >= len(d.data) {
		return 0, d.errorf("unterminated escape")
	}
	c := d.data[d.pos+1]
	d.pos += 2
	var r rune
	switch c {
	case '"', '\\', '/':
		r = rune(c)
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		var ok bool
		if r, ok = d.hex4(); !ok {
			return 0, d.errorf("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			r2 := utf8.RuneError
			if d.pos+1 < len(d.data) && d.data[d.pos] == '\\' && d.data[d.pos+1] == 'u' {
				save := d.pos
				d.pos += 2
				lo, ok := d.hex4()
				if ok && utf16.DecodeRune(r, lo) != utf8.RuneError {
					r2 = utf16.DecodeRune(r, lo)
				} else {
					d.pos = save
				}
			}
			r = r2
		}
	default:
		return 0, d.errorf("invalid escape \\%c", c)
	}
	return r, nil
}

func (d *Decoder) hex4() (rune, bool) {
	if d.pos+4 > len(d.data) {
		return 0, false
	}
	var r rune
	for _, c := range d.data[d.pos : d.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	d.pos += 4
	return r, true
}
