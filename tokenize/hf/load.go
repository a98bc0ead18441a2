package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"unicode/utf8"
)

// MaxFileBytes bounds the tokenizer.json [Load] reads and [Parse] accepts. The largest
// real files are about 35 MB (Gemma 3, gpt-oss).
const MaxFileBytes = 256 << 20

// Load reads a tokenizer.json file and builds its tokenizer with [DefaultConfig].
func Load(path string) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("hf: read %s: %w", path, err)
	}
	t, err := Parse(data, DefaultConfig())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of a tokenizer.json. It fails, naming the
// JSON path, on malformed input and on any component or option the encoder does not
// reproduce exactly.
func Parse(data []byte, cfg Config) (*Tokenizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("tokenizer.json: larger than %d bytes", MaxFileBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("tokenizer.json: not valid UTF-8")
	}
	if !json.Valid(data) {
		return nil, errors.New("tokenizer.json: not valid JSON")
	}
	top, err := parseObj("", data)
	if err != nil {
		return nil, errors.New("tokenizer.json: not a JSON object")
	}
	if v, ok, err := top.str("version"); err != nil {
		return nil, err
	} else if ok && v != "1.0" {
		return nil, unsupported("version", fmt.Sprintf("%q", v))
	}
	for _, key := range []string{"truncation", "padding"} {
		if top.has(key) {
			return nil, unsupported(key, "(must be null: it changes the ids)")
		}
	}
	if !top.has("model") {
		return nil, loadError("model", "missing")
	}
	t := &Tokenizer{scratches: new(sync.Pool)}
	if t.model, err = parseBPE(top.fields["model"]); err != nil {
		return nil, err
	}
	if top.has("normalizer") {
		if t.normalizer, err = parseNormalizer("normalizer", top.fields["normalizer"]); err != nil {
			return nil, err
		}
	}
	if top.has("pre_tokenizer") {
		if t.preTokenizer, err = parsePreTokenizer("pre_tokenizer", top.fields["pre_tokenizer"]); err != nil {
			return nil, err
		}
	}
	if top.has("post_processor") {
		if t.template, err = parsePostProcessor("post_processor", top.fields["post_processor"]); err != nil {
			return nil, err
		}
	}
	if top.has("added_tokens") {
		if t.added, t.addedIDs, err = parseAddedTokens(top.fields["added_tokens"], t.model, t.normalizer); err != nil {
			return nil, err
		}
	}
	if err := t.checkOffsetsNeeded(); err != nil {
		return nil, err
	}
	t.model.release()
	t.windowed = newWindowSplit(t.preTokenizer)
	t.memo = newMemo(cfg.MemoBytes)
	return t, nil
}

// addedToken is one entry of added_tokens.
type addedToken struct {
	Content    string `json:"content"`
	ID         uint32 `json:"id"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// parseAddedTokens builds the two added-token matchers the way the library's
// AddedVocabulary does: tokens are registered in file order, each taking the id of an
// earlier token with the same content, else its vocabulary id, else the next id after
// the vocabulary; normalized tokens are matched in normalized text by their normalized
// form. A file whose declared ids differ from those is rejected, since the library would
// silently use ids other than the ones the file states.
func parseAddedTokens(raw json.RawMessage, model *bpe, norm normalizer) (addedVocab, []uint32, error) {
	const path = "added_tokens"
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return addedVocab{}, nil, loadError(path, "want an array")
	}
	byContent := make(map[string]uint32, len(items))
	byID := make(map[uint32]addedToken, len(items))
	nextID := uint32(model.vocabSize)
	for i, item := range items {
		p := index(path, i)
		o, err := parseObj(p, item)
		if err != nil {
			return addedVocab{}, nil, err
		}
		if err := o.only("id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"); err != nil {
			return addedVocab{}, nil, err
		}
		var tok addedToken
		if err := json.Unmarshal(item, &tok); err != nil {
			return addedVocab{}, nil, loadError(p, "%v", err)
		}
		if !o.has("content") || !o.has("id") {
			return addedVocab{}, nil, loadError(p, "want content and id")
		}
		if tok.Content == "" {
			continue // the library ignores empty tokens
		}
		if id, ok := byContent[tok.Content]; ok && byID[id] == tok {
			continue
		}
		id, ok := byContent[tok.Content]
		if !ok {
			id, ok = model.tokenID(tok.Content)
		}
		if !ok {
			if nextID == ^uint32(0) {
				return addedVocab{}, nil, loadError(p, "too many ids")
			}
			id = nextID
			nextID++
		}
		if id != tok.ID {
			return addedVocab{}, nil, loadError(p+".id", "is %d but the library assigns %d to %q", tok.ID, id, tok.Content)
		}
		byContent[tok.Content] = id
		byID[id] = tok
	}
	ids := make([]uint32, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	added, err := buildAddedVocab(byID, norm)
	return added, ids, err
}

// checkOffsetsNeeded rejects pipelines whose ids would depend on offset tracking the
// encoder does not do. Metaspace's prepend_scheme "first" prepends only to text at
// offset 0 of the original input; the encoder knows that offset exactly when nothing
// before the Metaspace step can move text: no normalizer and Metaspace first in line.
func (t *Tokenizer) checkOffsetsNeeded() error {
	path, ok := firstOnlyPath(t.preTokenizer, "pre_tokenizer")
	if !ok {
		return nil
	}
	t.prependFirst = true
	if t.normalizer != nil {
		return unsupported(path, `"first" with a normalizer`)
	}
	if seq, isSeq := t.preTokenizer.(preSequence); isSeq {
		for i, step := range seq.steps {
			if m, isMeta := step.(*metaspace); isMeta && m.scheme == prependFirst && i > 0 {
				return unsupported(path, `"first" after another pre-tokenizer`)
			}
		}
	}
	return nil
}

// firstOnlyPath finds a Metaspace with prepend_scheme "first" and returns its path.
func firstOnlyPath(p preTokenizer, path string) (string, bool) {
	switch p := p.(type) {
	case *metaspace:
		return path + ".prepend_scheme", p.scheme == prependFirst
	case preSequence:
		for i, step := range p.steps {
			if sub, ok := firstOnlyPath(step, index(path+".pretokenizers", i)); ok {
				return sub, true
			}
		}
	}
	return "", false
}
