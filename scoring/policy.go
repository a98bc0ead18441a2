package scoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
)

// ApplyJSON returns p with the keys of a JSON object of policy keys (the YAML names,
// e.g. {"prefix_affinity_weight": 2}) replaced, and validates the result. Unknown keys,
// ill-typed values and trailing data are errors; p is not modified. Per-route overrides
// and runtime updates both go through it.
func (p Params) ApplyJSON(raw []byte) (Params, error) {
	if trimmed := bytes.TrimLeft(raw, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		// encoding/json takes null for "nothing to change": an update that names no key
		// must still be an object.
		return p, errors.New("not a JSON object of policy keys")
	}
	if err := checkKeys(raw); err != nil {
		return p, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	out := p
	if err := dec.Decode(&out); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			if number, ok := strings.CutPrefix(typeErr.Value, "number "); ok && typeErr.Type.Kind() == reflect.Float64 {
				// A number past float64's range (encoding/json gives its text): out of
				// bounds, as Validate words it, not of the wrong type.
				return p, outOfRange(typeErr.Field, number, !strings.HasPrefix(number, "-"))
			}
			// The object is one; a value in it is not of its key's type.
			want := "a number"
			if typeErr.Type.Kind() == reflect.Bool {
				want = "true or false"
			}
			return p, fmt.Errorf("%s: must be %s, got %s %s", typeErr.Field, want, article(typeErr.Value), typeErr.Value)
		}
		return p, fmt.Errorf("not a JSON object of policy keys: %v", err)
	}
	// Only white space may follow the object. dec.More() would not do: it reports
	// false before a '}' or ']', so `{"a": 1}}{"b": 2}` applied a and dropped b.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return p, errors.New("trailing data after the JSON object")
	}
	if err := out.Validate(); err != nil {
		return p, err
	}
	return out, nil
}

// article is "a" or "an" before a JSON value's kind as encoding/json names it
// ("string", "number", "bool", "array", "object").
func article(kind string) string {
	if strings.HasPrefix(kind, "a") || strings.HasPrefix(kind, "o") {
		return "an"
	}
	return "a"
}

// checkKeys rejects what encoding/json would quietly accept in a JSON object of policy
// keys: a key spelled with other capitals than the config file's (encoding/json matches
// field names case-insensitively, so "Queue_Weight" set queue_weight) and a key given
// twice (the last one won). Anything else wrong is left to the decoder, which names it.
func checkKeys(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		if err != nil || !isKey {
			return nil
		}
		if seen[key] {
			return fmt.Errorf("policy key %q given twice", key)
		}
		seen[key] = true
		if name, ok := policyKeyFolded(key); ok && name != key {
			return fmt.Errorf("unknown policy key %q: keys are case-sensitive (did you mean %q?)", key, name)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil
		}
	}
	return nil
}

// policyKeyFolded returns the policy key that key matches under encoding/json's
// case-insensitive field matching, if any: Unicode simple folding, which is
// strings.EqualFold's ("ſ" and the Kelvin sign "K" match "s" and "k" too).
func policyKeyFolded(key string) (string, bool) {
	for _, name := range policyKeys {
		if strings.EqualFold(key, name) {
			return name, true
		}
	}
	return "", false
}

// policyKeys are the policy keys (Params' JSON names). Built once and never written.
var policyKeys = func() []string {
	fields := reflect.TypeFor[Params]()
	keys := make([]string, 0, fields.NumField())
	for i := range fields.NumField() {
		name, _, _ := strings.Cut(fields.Field(i).Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	return keys
}()

// Policy holds the cost parameters in force. Runtime updates swap the whole set, so a
// decision sees the old parameters or the new ones, never a mix. Safe for concurrent use.
type Policy struct {
	params atomic.Pointer[Params]
	mu     sync.Mutex // serialises updates, so none is lost
}

// NewPolicy returns a policy holding validated params.
func NewPolicy(params Params) (*Policy, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{}
	p.params.Store(&params)
	return p, nil
}

// Params returns the parameters in force.
func (p *Policy) Params() Params { return *p.params.Load() }

// Set replaces the parameters in force with a validated set. On error nothing changes.
func (p *Policy) Set(params Params) error {
	if err := params.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.params.Store(&params)
	return nil
}

// Update applies a JSON object of policy keys onto the parameters in force (only the
// keys it names change) and returns the set it replaced and the new one, read under
// the update lock (two concurrent updates each report their own before). On error
// nothing changes.
func (p *Policy) Update(raw []byte) (before, after Params, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before = p.Params()
	after, err = before.ApplyJSON(raw)
	if err != nil {
		return before, before, err
	}
	p.params.Store(&after)
	return before, after, nil
}
