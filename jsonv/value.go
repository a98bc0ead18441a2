package jsonv

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Kind is the JSON type of a [Value].
type Kind uint8

// The kinds of JSON values. The zero Value is Null.
const (
	Null Kind = iota
	False
	True
	Number
	String
	Array
	Object
)

var kindNames = [...]string{"null", "false", "true", "number", "string", "array", "object"}

// String names the kind as JSON spells it ("object", "true", …).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is a parsed JSON value. Objects keep their members in document order (a
// template's tojson must reproduce the request's key order); a key that appears twice
// keeps its first position and its last value, as Python's json module does. A Value is
// immutable once parsed and safe to share between goroutines.
//
// A Value is 16 bytes, a pointer and a length, where a string and a slice header would
// make it 48: a request body of tiny values (`[0,0,0,…]`) materialises one per two bytes
// of body, so the size of a Value is what such a body costs (24 times the body at 48).
// Its length is 32 bits: the constructors below panic on a string of 4 GiB or more, or
// 2³² items (the decoder refuses input that large).
type Value struct {
	// p points at a String's decoded text or a Number's literal as written (n bytes), or
	// at an Array's elements or an Object's members as key, value, key, value… (n
	// Values; keys are String values). It is nil when n is 0, and what it points at is
	// never written once the Value exists.
	p    unsafe.Pointer
	n    uint32
	kind Kind
}

// textValue returns a String or a Number of text s.
func textValue(k Kind, s string) Value {
	if len(s) == 0 {
		return Value{kind: k}
	}
	if uint64(len(s)) > math.MaxUint32 {
		panic("jsonv: a string of 4 GiB or more")
	}
	return Value{kind: k, p: unsafe.Pointer(unsafe.StringData(s)), n: uint32(len(s))}
}

// containerValue returns an Array of elements items, or an Object of members items
// (key, value, key, value…). The Value shares items.
func containerValue(k Kind, items []Value) Value {
	if len(items) == 0 {
		return Value{kind: k}
	}
	if uint64(len(items)) > math.MaxUint32 {
		panic("jsonv: an array or object of 2³² items or more")
	}
	return Value{kind: k, p: unsafe.Pointer(unsafe.SliceData(items)), n: uint32(len(items))}
}

// items returns an Array's elements or an Object's members (key, value, key, value…),
// nil for other kinds.
func (v Value) items() []Value {
	if v.kind != Array && v.kind != Object || v.n == 0 {
		return nil
	}
	return unsafe.Slice((*Value)(v.p), v.n)
}

// Kind returns the value's JSON type.
func (v Value) Kind() Kind { return v.kind }

// IsNull reports whether v is null (or the zero Value).
func (v Value) IsNull() bool { return v.kind == Null }

// Str returns a String's text or a Number's literal, and "" for other kinds.
func (v Value) Str() string {
	if v.kind != String && v.kind != Number || v.n == 0 {
		return ""
	}
	return unsafe.String((*byte)(v.p), v.n)
}

// Bool returns true for the JSON literal true, false otherwise.
func (v Value) Bool() bool { return v.kind == True }

// Truthy is Python's truth value of the decoded value (bool() of what json.loads
// returns): false for null, false, 0, "", [] and {}, and for the zero Value (absent).
func (v Value) Truthy() bool {
	switch v.kind {
	case True:
		return true
	case Number:
		f, ok := v.Float()
		return !ok || f != 0
	case String:
		return v.n > 0
	case Array, Object:
		return v.n > 0
	}
	return false
}

// Len returns the number of an Array's elements or an Object's members, else 0.
func (v Value) Len() int {
	switch v.kind {
	case Array:
		return int(v.n)
	case Object:
		return int(v.n) / 2
	}
	return 0
}

// Items returns an Array's elements (nil for other kinds, and for an empty array). The
// slice is shared: do not modify it.
func (v Value) Items() []Value {
	if v.kind != Array {
		return nil
	}
	return v.items()
}

// Member returns an Object's i-th member in document order. It panics if i is out of
// range, like a slice index.
func (v Value) Member(i int) (key string, value Value) {
	if v.kind != Object {
		panic("jsonv: Member of a " + v.kind.String())
	}
	items := v.items()
	return items[2*i].Str(), items[2*i+1]
}

// Get returns the member of an Object named key, and whether there is one.
func (v Value) Get(key string) (Value, bool) {
	if v.kind != Object {
		return Value{}, false
	}
	items := v.items()
	for i := 0; i < len(items); i += 2 {
		if items[i].Str() == key {
			return items[i+1], true
		}
	}
	return Value{}, false
}

// Int returns a Number that is an integer in the int64 range (written without fraction
// or exponent, as Python's json reads an int), and whether it is one.
func (v Value) Int() (int64, bool) {
	if !v.IsInteger() { // not a Number, or not written as an integer: no error built
		return 0, false
	}
	n, err := strconv.ParseInt(v.Str(), 10, 64)
	return n, err == nil
}

// Float returns a Number as a float64, and false for other kinds or a literal out of
// the float64 range. NaN, Infinity and -Infinity ([Decoder.AcceptNonFinite]) are read
// as those floats.
func (v Value) Float() (float64, bool) {
	if v.kind != Number {
		return 0, false
	}
	f, err := strconv.ParseFloat(v.Str(), 64)
	return f, err == nil
}

// IsInteger reports whether a Number is written as an integer (digits after an optional
// minus: no fraction or exponent, nor NaN or Infinity), which Python's json decodes as
// int rather than float, whatever its size.
func (v Value) IsInteger() bool {
	if v.kind != Number {
		return false
	}
	lit := strings.TrimPrefix(v.Str(), "-")
	for i := 0; i < len(lit); i++ {
		if c := lit[i]; c < '0' || c > '9' {
			return false
		}
	}
	return lit != ""
}

// StringValue returns a String value, for building values in code and tests.
func StringValue(s string) Value { return textValue(String, s) }

// ObjectValue returns an object of the given members, in order (keys must be distinct),
// for building values in code and tests. It panics if the slices differ in length.
func ObjectValue(keys []string, values []Value) Value {
	if len(keys) != len(values) {
		panic("jsonv: ObjectValue needs as many values as keys")
	}
	items := make([]Value, 0, 2*len(keys))
	for i, k := range keys {
		items = append(items, StringValue(k), values[i])
	}
	return containerValue(Object, items)
}

// ArrayValue returns an array of the given elements; it shares items.
func ArrayValue(items ...Value) Value { return containerValue(Array, items) }

// BoolValue returns the JSON literal true or false.
func BoolValue(b bool) Value {
	if b {
		return Value{kind: True}
	}
	return Value{kind: False}
}

// AppendCompact appends v as compact JSON (no spaces), keys in order, strings escaped
// as encoding/json does without HTML escaping.
func (v Value) AppendCompact(dst []byte) []byte {
	switch v.kind {
	case False:
		return append(dst, "false"...)
	case True:
		return append(dst, "true"...)
	case Number:
		return append(dst, v.Str()...)
	case String:
		return AppendQuoted(dst, v.Str(), false)
	case Array:
		dst = append(dst, '[')
		for i, it := range v.items() {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = it.AppendCompact(dst)
		}
		return append(dst, ']')
	case Object:
		dst = append(dst, '{')
		items := v.items()
		for i := 0; i < len(items); i += 2 {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendQuoted(dst, items[i].Str(), false)
			dst = append(dst, ':')
			dst = items[i+1].AppendCompact(dst)
		}
		return append(dst, '}')
	}
	return append(dst, "null"...)
}

// AppendQuoted appends s as a JSON string. With asciiOnly, every rune above U+007F is
// written as \uXXXX (surrogate pairs above U+FFFF), as Python's json.dumps does by
// default; without it, only what JSON requires is escaped (Python's ensure_ascii=False).
func AppendQuoted(dst []byte, s string, asciiOnly bool) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c < 0x20 || c == 0x7f && asciiOnly:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !asciiOnly {
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		if r >= 0x10000 {
			r -= 0x10000
			hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
			dst = append(dst, '\\', 'u', hex[hi>>12], hex[hi>>8&0xf], hex[hi>>4&0xf], hex[hi&0xf])
			r = lo
		}
		dst = append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
		i += size
	}
	return append(dst, '"')
}
