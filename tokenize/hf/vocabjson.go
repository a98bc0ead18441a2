package hf

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
)

// The vocabulary and the merges are nearly all of a tokenizer.json (hundreds of
// thousands of entries); reading them with reflection-based decoding takes seconds.
// scanner reads just these two shapes; anything unexpected is an error, and strings
// with escapes are handed to encoding/json so they decode exactly as elsewhere.
type scanner struct {
	data []byte
	pos  int
}

var errSyntax = errors.New("malformed JSON")

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte (0 at the end).
func (s *scanner) peek() byte {
	s.skipSpace()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return errSyntax
	}
	s.pos++
	return nil
}

func (s *scanner) str() (string, error) {
	if s.peek() != '"' {
		return "", errSyntax
	}
	start := s.pos
	escaped := false
	for i := start + 1; i < len(s.data); i++ {
		switch c := s.data[i]; {
		case c == '\\':
			escaped = true
			i++
		case c == '"':
			s.pos = i + 1
			if !escaped {
				return string(s.data[start+1 : i]), nil
			}
			var out string
			if err := json.Unmarshal(s.data[start:i+1], &out); err != nil {
				return "", errSyntax
			}
			return out, nil
		case c < 0x20:
			return "", errSyntax
		}
	}
	return "", errSyntax
}

func (s *scanner) uint32() (uint32, error) {
	s.skipSpace()
	start := s.pos
	var n uint64
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		n = n*10 + uint64(s.data[s.pos]-'0')
		if n > math.MaxUint32 {
			return 0, errSyntax
		}
		s.pos++
	}
	digits := s.pos - start
	if digits == 0 || digits > 1 && s.data[start] == '0' {
		return 0, errSyntax
	}
	if s.pos < len(s.data) && strings.IndexByte(".eE-+", s.data[s.pos]) >= 0 {
		return 0, errSyntax // not an integer
	}
	return uint32(n), nil
}

// list reads the elements of an array with item.
func (s *scanner) list(item func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := item(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return errSyntax
		}
	}
}

func (s *scanner) end() error {
	if s.peek() != 0 {
		return errSyntax
	}
	return nil
}

// decodeVocab reads {"token": id, …}; a repeated token keeps its last id.
func decodeVocab(raw []byte) (map[string]uint32, error) {
	s := &scanner{data: raw}
	if err := s.expect('{'); err != nil {
		return nil, err
	}
	vocab := make(map[string]uint32, len(raw)/16)
	if s.peek() == '}' {
		s.pos++
		return vocab, s.end()
	}
	for {
		tok, err := s.str()
		if err != nil {
			return nil, err
		}
		if err := s.expect(':'); err != nil {
			return nil, err
		}
		id, err := s.uint32()
		if err != nil {
			return nil, err
		}
		vocab[tok] = id
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return vocab, s.end()
		default:
			return nil, errSyntax
		}
	}
}

// decodeMerges reads ["left right", …] or [["left", "right"], …]. Strings that are not
// exactly two tokens come back as one element (parseMerges reports them).
func decodeMerges(raw []byte) (lines []string, pairs [][2]string, err error) {
	s := &scanner{data: raw}
	err = s.list(func() error {
		if s.peek() == '"' {
			if pairs != nil {
				return errSyntax
			}
			line, err := s.str()
			lines = append(lines, line)
			return err
		}
		if lines != nil {
			return errSyntax
		}
		var pair [2]string
		n := 0
		err := s.list(func() error {
			if n == 2 {
				return errSyntax
			}
			var err error
			pair[n], err = s.str()
			n++
			return err
		})
		if err != nil || n != 2 {
			return errSyntax
		}
		if pairs == nil {
			pairs = make([][2]string, 0, len(raw)/24)
		}
		pairs = append(pairs, pair)
		return nil
	})
	if err == nil {
		err = s.end()
	}
	return lines, pairs, err
}

// skipValue moves past one JSON value (already known to be valid JSON).
func (s *scanner) skipValue() error {
	depth := 0
	for {
		switch c := s.peek(); c {
		case 0:
			return errSyntax
		case '"':
			if _, err := s.skipString(); err != nil {
				return err
			}
		case '{', '[':
			depth++
			s.pos++
		case '}', ']':
			depth--
			s.pos++
		case ',', ':':
			if depth == 0 {
				return errSyntax
			}
			s.pos++
		default:
			for s.pos < len(s.data) && strings.IndexByte(",}] \t\r\n", s.data[s.pos]) < 0 {
				s.pos++
			}
		}
		if depth == 0 {
			return nil
		}
		if depth < 0 {
			return errSyntax
		}
	}
}

func (s *scanner) skipString() (int, error) {
	start := s.pos
	for i := start + 1; i < len(s.data); i++ {
		switch s.data[i] {
		case '\\':
			i++
		case '"':
			s.pos = i + 1
			return start, nil
		}
	}
	return 0, errSyntax
}

// splitObject returns the fields of a JSON object as raw values (slices of raw). A
// repeated key keeps its last value, as a map decoder does.
func splitObject(raw []byte) (map[string]json.RawMessage, error) {
	s := &scanner{data: raw}
	if err := s.expect('{'); err != nil {
		return nil, err
	}
	fields := map[string]json.RawMessage{}
	if s.peek() == '}' {
		s.pos++
		return fields, s.end()
	}
	for {
		key, err := s.str()
		if err != nil {
			return nil, err
		}
		if err := s.expect(':'); err != nil {
			return nil, err
		}
		start := s.pos
		if err := s.skipValue(); err != nil {
			return nil, err
		}
		fields[key] = raw[start:s.pos:s.pos]
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return fields, s.end()
		default:
			return nil, errSyntax
		}
	}
}
