package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

// obj is one JSON object of a tokenizer.json with the path it was found at, so every
// load error names where in the file it comes from.
type obj struct {
	path   string
	fields map[string]json.RawMessage
}

// loadError is an error about the value at path.
func loadError(path, format string, args ...any) error {
	return fmt.Errorf("tokenizer.json: %s: %s", path, fmt.Sprintf(format, args...))
}

// unsupported is the error for a component or option the encoder does not implement.
func unsupported(path, what string) error {
	return fmt.Errorf("tokenizer.json: %s %s is not supported", path, what)
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// parseObj splits a JSON object, which must be valid JSON (Parse checks the file once).
func parseObj(path string, raw json.RawMessage) (obj, error) {
	fields, err := splitObject(raw)
	if err != nil {
		return obj{}, loadError(path, "want an object")
	}
	return obj{path: path, fields: fields}, nil
}

func (o obj) at(key string) string { return join(o.path, key) }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// has reports whether key is present and not null.
func (o obj) has(key string) bool { return !isNull(o.fields[key]) }

// typ returns the object's "type".
func (o obj) typ() (string, error) {
	t, ok, err := o.str("type")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", loadError(o.at("type"), "missing")
	}
	return t, nil
}

// str returns a string field; ok is false when it is absent or null.
func (o obj) str(key string) (s string, ok bool, err error) {
	if !o.has(key) {
		return "", false, nil
	}
	if err := json.Unmarshal(o.fields[key], &s); err != nil {
		return "", false, loadError(o.at(key), "want a string")
	}
	return s, true, nil
}

// boolean returns a bool field. An absent or null field is def when the library has a
// default for it (hasDef), and an error otherwise: guessing a default could change ids.
func (o obj) boolean(key string, def, hasDef bool) (bool, error) {
	if !o.has(key) {
		if hasDef {
			return def, nil
		}
		return false, loadError(o.at(key), "missing")
	}
	var b bool
	if err := json.Unmarshal(o.fields[key], &b); err != nil {
		return false, loadError(o.at(key), "want true or false")
	}
	return b, nil
}

// list returns an array field's elements; an absent or null field is an error.
func (o obj) list(key string) ([]json.RawMessage, error) {
	if !o.has(key) {
		return nil, loadError(o.at(key), "missing")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(o.fields[key], &items); err != nil {
		return nil, loadError(o.at(key), "want an array")
	}
	return items, nil
}

// only fails when the object sets a field outside known to a non-null value: an option
// the encoder does not know might change ids.
func (o obj) only(known ...string) error {
	var extra []string
	for k, v := range o.fields {
		if isNull(v) {
			continue
		}
		found := false
		for _, kk := range known {
			if k == kk {
				found = true
				break
			}
		}
		if !found {
			extra = append(extra, k)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	sort.Strings(extra)
	return fmt.Errorf("tokenizer.json: %s is not supported (an option this encoder does not know)", o.at(extra[0]))
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// sequence reads a Sequence component, {"type": "Sequence", key: [...]}: each item
// parsed by parse, the items that do nothing (the zero T) left out.
func sequence[T comparable](o obj, key string, parse func(path string, raw json.RawMessage) (T, error)) ([]T, error) {
	if err := o.only("type", key); err != nil {
		return nil, err
	}
	items, err := o.list(key)
	if err != nil {
		return nil, err
	}
	var steps []T
	var none T
	for i, item := range items {
		step, err := parse(index(o.at(key), i), item)
		if err != nil {
			return nil, err
		}
		if step != none {
			steps = append(steps, step)
		}
	}
	return steps, nil
}
