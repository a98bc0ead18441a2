package hf

import (
	"encoding/json"
	"fmt"
	"strings"
)

// normalizer rewrites a segment of text before pre-tokenization. Implementations are
// immutable.
type normalizer interface {
	normalize(s string) (string, error)
}

// prepend adds its text in front of non-empty text.
type prepend struct{ text string }

func (p prepend) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return p.text + s, nil
}

// replace substitutes content for every match of its pattern.
type replace struct {
	pattern pattern
	content string
}

func (r replace) normalize(s string) (string, error) {
	if lit, ok := r.pattern.(literal); ok {
		return strings.ReplaceAll(s, string(lit), r.content), nil
	}
	parts, err := findMatches(r.pattern, s, new(scratch))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, p := range parts {
		if p.isMatch {
			b.WriteString(r.content)
		} else {
			b.WriteString(s[p.start:p.end])
		}
	}
	return b.String(), nil
}

type normSequence []normalizer

func (seq normSequence) normalize(s string) (string, error) {
	var err error
	for _, n := range seq {
		if s, err = n.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}

// parseNormalizer builds the normalizer at path. An empty Sequence yields nil (none).
func parseNormalizer(path string, raw json.RawMessage) (normalizer, error) {
	o, err := parseObj(path, raw)
	if err != nil {
		return nil, err
	}
	t, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch t {
	case "NFC", "NFD", "NFKC", "NFKD":
		if err := o.only("type"); err != nil {
			return nil, err
		}
		return newUnicodeForm(t), nil
	case "Prepend":
		if err := o.only("type", "prepend"); err != nil {
			return nil, err
		}
		s, ok, err := o.str("prepend")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, loadError(o.at("prepend"), "missing")
		}
		return prepend{s}, nil
	case "Replace":
		if err := o.only("type", "pattern", "content"); err != nil {
			return nil, err
		}
		p, err := parsePattern(o.at("pattern"), o.fields["pattern"])
		if err != nil {
			return nil, err
		}
		content, ok, err := o.str("content")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, loadError(o.at("content"), "missing")
		}
		return replace{pattern: p, content: content}, nil
	case "Sequence":
		steps, err := sequence(o, "normalizers", parseNormalizer)
		if err != nil {
			return nil, err
		}
		seq := normSequence(steps)
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	}
	return nil, unsupported(o.at("type"), fmt.Sprintf("%q", t))
}
