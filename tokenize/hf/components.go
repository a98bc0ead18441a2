package hf

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// parsePreTokenizer builds the pre-tokenizer at path. An empty Sequence yields nil.
func parsePreTokenizer(path string, raw json.RawMessage) (preTokenizer, error) {
	o, err := parseObj(path, raw)
	if err != nil {
		return nil, err
	}
	t, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch t {
	case "Split":
		return parseSplit(o)
	case "ByteLevel":
		if err := o.only("type", "add_prefix_space", "trim_offsets", "use_regex"); err != nil {
			return nil, err
		}
		prefix, err := o.boolean("add_prefix_space", false, false)
		if err != nil {
			return nil, err
		}
		useRegex, err := o.boolean("use_regex", true, true)
		if err != nil {
			return nil, err
		}
		b := &byteLevel{addPrefixSpace: prefix}
		if useRegex {
			re, err := compileRegex(o.path, gpt2Split)
			if err != nil {
				return nil, err
			}
			b.gpt2 = &re
		}
		return b, nil
	case "Metaspace":
		return parseMetaspace(o)
	case "Digits":
		if err := o.only("type", "individual_digits"); err != nil {
			return nil, err
		}
		individual, err := o.boolean("individual_digits", false, false)
		if err != nil {
			return nil, err
		}
		return digits{individual}, nil
	case "Sequence":
		steps, err := sequence(o, "pretokenizers", parsePreTokenizer)
		if err != nil {
			return nil, err
		}
		seq := preSequence{steps}
		switch len(seq.steps) {
		case 0:
			return nil, nil
		case 1:
			return seq.steps[0], nil
		}
		return seq, nil
	}
	return nil, unsupported(o.at("type"), fmt.Sprintf("%q", t))
}

func parseSplit(o obj) (preTokenizer, error) {
	if err := o.only("type", "pattern", "behavior", "invert"); err != nil {
		return nil, err
	}
	p, err := parsePattern(o.at("pattern"), o.fields["pattern"])
	if err != nil {
		return nil, err
	}
	name, ok, err := o.str("behavior")
	if err != nil {
		return nil, err
	}
	b, known := behaviors[name]
	if !ok || !known {
		return nil, loadError(o.at("behavior"), "want one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous")
	}
	invert, err := o.boolean("invert", false, false)
	if err != nil {
		return nil, err
	}
	return &split{pattern: p, behavior: b, invert: invert}, nil
}

// parseMetaspace follows the library's deserializer: prepend_scheme defaults to
// "always", split to true, and add_prefix_space false (an older spelling) means "never"
// and contradicts any other declared scheme.
func parseMetaspace(o obj) (preTokenizer, error) {
	if err := o.only("type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"); err != nil {
		return nil, err
	}
	rep, ok, err := o.str("replacement")
	if err != nil {
		return nil, err
	}
	r, size := utf8.DecodeRuneInString(rep)
	if !ok || size == 0 || size != len(rep) {
		return nil, loadError(o.at("replacement"), "want one character")
	}
	m := &metaspace{replacement: r, scheme: prependAlways}
	scheme, ok, err := o.str("prepend_scheme")
	if err != nil {
		return nil, err
	}
	if ok {
		s, known := map[string]prependScheme{"always": prependAlways, "never": prependNever, "first": prependFirst}[scheme]
		if !known {
			return nil, loadError(o.at("prepend_scheme"), `want "always", "never" or "first"`)
		}
		m.scheme = s
	}
	if o.has("add_prefix_space") {
		add, err := o.boolean("add_prefix_space", false, false)
		if err != nil {
			return nil, err
		}
		if !add {
			if m.scheme != prependNever {
				return nil, loadError(o.at("add_prefix_space"), "false does not match prepend_scheme")
			}
			m.scheme = prependNever
		}
	}
	if m.split, err = o.boolean("split", true, true); err != nil {
		return nil, err
	}
	return m, nil
}

// templatePiece is one item of a TemplateProcessing template: the encoded input, or
// special token ids added only with addSpecialTokens.
type templatePiece struct {
	sequence bool
	ids      []uint32
}

// parsePostProcessor returns the single-sequence template of the post-processor at path,
// nil when it adds nothing. ByteLevel only adjusts offsets, so it adds nothing.
func parsePostProcessor(path string, raw json.RawMessage) ([]templatePiece, error) {
	o, err := parseObj(path, raw)
	if err != nil {
		return nil, err
	}
	t, err := o.typ()
	if err != nil {
		return nil, err
	}
	switch t {
	case "ByteLevel":
		return nil, o.only("type", "add_prefix_space", "trim_offsets", "use_regex")
	case "TemplateProcessing":
		return parseTemplate(o)
	case "Sequence":
		if err := o.only("type", "processors"); err != nil {
			return nil, err
		}
		items, err := o.list("processors")
		if err != nil {
			return nil, err
		}
		// Each processor rewrites the previous one's output: a template applied to a
		// templated encoding repeats its sequence pieces over the whole result.
		tmpl := []templatePiece{{sequence: true}}
		for i, item := range items {
			next, err := parsePostProcessor(index(o.at("processors"), i), item)
			if err != nil {
				return nil, err
			}
			if next != nil {
				tmpl = compose(next, tmpl)
			}
		}
		if len(tmpl) == 1 && tmpl[0].sequence {
			return nil, nil
		}
		return tmpl, nil
	}
	return nil, unsupported(o.at("type"), fmt.Sprintf("%q", t))
}

// compose returns outer applied to the output of inner.
func compose(outer, inner []templatePiece) []templatePiece {
	var out []templatePiece
	for _, p := range outer {
		if p.sequence {
			out = append(out, inner...)
		} else {
			out = append(out, p)
		}
	}
	return out
}

func parseTemplate(o obj) ([]templatePiece, error) {
	if err := o.only("type", "single", "pair", "special_tokens"); err != nil {
		return nil, err
	}
	var specials map[string]struct {
		IDs []uint32 `json:"ids"`
	}
	if o.has("special_tokens") {
		if err := json.Unmarshal(o.fields["special_tokens"], &specials); err != nil {
			return nil, loadError(o.at("special_tokens"), "want an object of {id, ids, tokens}")
		}
	}
	items, err := o.list("single")
	if err != nil {
		return nil, err
	}
	var tmpl []templatePiece
	for i, item := range items {
		p := index(o.at("single"), i)
		var piece struct {
			Sequence *struct {
				ID string `json:"id"`
			}
			SpecialToken *struct {
				ID string `json:"id"`
			}
		}
		if err := json.Unmarshal(item, &piece); err != nil || (piece.Sequence == nil) == (piece.SpecialToken == nil) {
			return nil, loadError(p, `want {"Sequence": …} or {"SpecialToken": …}`)
		}
		if piece.Sequence != nil {
			if piece.Sequence.ID != "A" {
				return nil, loadError(p+".Sequence.id", "want A in the single-sequence template")
			}
			tmpl = append(tmpl, templatePiece{sequence: true})
			continue
		}
		st, ok := specials[piece.SpecialToken.ID]
		if !ok {
			return nil, loadError(p+".SpecialToken.id", "%q is not in special_tokens", piece.SpecialToken.ID)
		}
		tmpl = append(tmpl, templatePiece{ids: st.IDs})
	}
	return tmpl, nil
}
