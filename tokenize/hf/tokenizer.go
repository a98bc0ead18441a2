package hf

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvroute/kvroute/tokenize"
)

// Config tunes the caches of a loaded tokenizer. The caches hold only results the
// encoder would compute identically again, so they change speed, never ids.
type Config struct {
	// MemoBytes bounds the segment memo, in bytes of text and ids plus a fixed
	// per-entry overhead; 0 disables it.
	MemoBytes int64 `yaml:"memo_bytes"`
}

// DefaultConfig returns a 32 MiB segment memo: about a thousand 4,096-token
// conversations.
func DefaultConfig() Config { return Config{MemoBytes: 32 << 20} }

// Validate reports a setting out of range, naming its YAML key.
func (c Config) Validate() error {
	if c.MemoBytes < 0 {
		return errors.New("memo_bytes: must be ≥ 0")
	}
	return nil
}

// Tokenizer encodes text exactly as the Hugging Face tokenizers library does for the
// tokenizer.json it was built from. Build one with [Load], [Parse] or [LoadBuiltin].
type Tokenizer struct {
	added        addedVocab
	normalizer   normalizer   // nil: none
	preTokenizer preTokenizer // nil: none
	model        *bpe
	template     []templatePiece // nil: no post-processor that adds tokens
	// prependFirst: the pipeline prepends to text at offset 0 of the input only, so
	// whether a piece starts the input is part of its memo key.
	prependFirst bool
	memo         *memo
	// scratches pools the encode buffers (*scratch) of finished calls.
	scratches *sync.Pool
}

var (
	_ tokenize.Tokenizer     = (*Tokenizer)(nil)
	_ tokenize.AppendEncoder = (*Tokenizer)(nil)
)

// Encode implements [tokenize.Tokenizer]. Added-token text inside the input (such as
// "<|im_start|>") becomes that token, as in the library with either value of
// addSpecialTokens; addSpecialTokens applies the post-processor (e.g. a leading BOS).
// Invalid UTF-8 bytes are read as U+FFFD, as a JSON decoder would. The only errors are
// an unk_token missing from the vocabulary and a pre-tokenizer regex exceeding its
// backtracking limit on pathological input.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return t.AppendEncode(nil, text, addSpecialTokens)
}

// AppendEncode implements [tokenize.AppendEncoder]: it appends Encode's ids to dst, so
// a caller that reuses its buffer encodes without allocating one.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		text = validUTF8(text)
	}
	sc, _ := t.scratches.Get().(*scratch)
	if sc == nil {
		sc = new(scratch)
	}
	defer func() { t.scratches.Put(sc.trimmed()) }()
	// The vocabularies kvroute serves average about four bytes a token on prose and
	// fewer on code; a third of the bytes leaves room for both without regrowing.
	ids := slices.Grow(dst, len(text)/3+8)
	if t.template == nil {
		return t.encodeBody(text, ids, sc)
	}
	var err error
	bodyAt, bodyEnd := -1, -1 // the first copy of the body in ids
	for _, p := range t.template {
		switch {
		case !p.sequence:
			if addSpecialTokens {
				ids = append(ids, p.ids...)
			}
		case bodyAt < 0:
			bodyAt = len(ids)
			if ids, err = t.encodeBody(text, ids, sc); err != nil {
				return nil, err
			}
			bodyEnd = len(ids)
		default:
			ids = append(ids, ids[bodyAt:bodyEnd]...)
		}
	}
	return ids, nil
}

// encodeBody appends the ids of text without post-processing.
func (t *Tokenizer) encodeBody(text string, ids []uint32, sc *scratch) ([]uint32, error) {
	var err error
	sc.rawSpans = t.added.raw.split(text, sc.rawSpans[:0])
	for _, sp := range sc.rawSpans {
		if sp.id >= 0 {
			ids = append(ids, uint32(sp.id))
			continue
		}
		if ids, err = t.encodeSegment(text[sp.start:sp.end], sp.start == 0, ids, sc); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// encodeSegment encodes text between tokens of the raw-text matcher: it is normalized
// as a whole, then cut again by the tokens matched in normalized text. The memo holds
// whole segments when a normalizer runs (a hit skips it), else the pieces between
// normalized-text tokens (which then need no normalizing to be found).
func (t *Tokenizer) encodeSegment(seg string, atStart bool, ids []uint32, sc *scratch) ([]uint32, error) {
	if seg == "" {
		return ids, nil
	}
	if t.normalizer == nil {
		return t.encodePieces(seg, atStart, ids, true, sc)
	}
	return t.memoized(seg, atStart, ids, func(ids []uint32) ([]uint32, error) {
		normalized, err := t.normalizer.normalize(seg)
		if err != nil {
			return nil, err
		}
		return t.encodePieces(normalized, atStart, ids, false, sc)
	})
}

// encodePieces cuts normalized text at the tokens matched in normalized text and
// encodes the pieces between them.
func (t *Tokenizer) encodePieces(s string, atStart bool, ids []uint32, memo bool, sc *scratch) ([]uint32, error) {
	if t.added.normalized == nil {
		return t.encodePiece(s, atStart, ids, memo, sc)
	}
	var err error
	sc.normalizedSpans = t.added.normalized.split(s, sc.normalizedSpans[:0])
	for _, sp := range sc.normalizedSpans {
		if sp.id >= 0 {
			ids = append(ids, uint32(sp.id))
			continue
		}
		if ids, err = t.encodePiece(s[sp.start:sp.end], atStart && sp.start == 0, ids, memo, sc); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// encodePiece encodes normalized text holding no added token. Its ids depend on nothing
// else (and on atStart only when prependFirst), which is what makes the memo exact.
func (t *Tokenizer) encodePiece(piece string, atStart bool, ids []uint32, memo bool, sc *scratch) ([]uint32, error) {
	if piece == "" {
		return ids, nil
	}
	if !memo {
		return t.tokenizePiece(piece, atStart, ids, sc)
	}
	return t.memoized(piece, atStart, ids, func(ids []uint32) ([]uint32, error) {
		return t.tokenizePiece(piece, atStart, ids, sc)
	})
}

// tokenizePiece pre-tokenizes a piece and encodes its words.
func (t *Tokenizer) tokenizePiece(piece string, atStart bool, ids []uint32, sc *scratch) ([]uint32, error) {
	words := sc.startWords(piece, atStart)
	var err error
	if t.preTokenizer != nil {
		if words, err = t.preTokenizer.preTokenize(words, sc); err != nil {
			return nil, err
		}
	}
	for _, w := range words {
		if ids, err = t.model.encodeWord(w.text, ids); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// memoized appends the ids memoised for key, or computes, appends and memoises them.
func (t *Tokenizer) memoized(key string, atStart bool, ids []uint32, compute func([]uint32) ([]uint32, error)) ([]uint32, error) {
	if t.memo == nil {
		return compute(ids)
	}
	if t.prependFirst {
		key = memoKey(key, atStart)
	}
	if hit, ok := t.memo.get(key); ok {
		return append(ids, hit...), nil
	}
	start := len(ids)
	ids, err := compute(ids)
	if err != nil {
		return nil, err
	}
	t.memo.put(key, ids[start:])
	return ids, nil
}

func memoKey(piece string, atStart bool) string {
	if atStart {
		return "\x01" + piece
	}
	return "\x00" + piece
}

// validUTF8 replaces each byte that is not part of valid UTF-8 with U+FFFD.
func validUTF8(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		b.WriteRune(r) // an invalid byte decodes as utf8.RuneError, i.e. U+FFFD
	}
	return b.String()
}

// Stats are counters of a tokenizer's segment memo.
type Stats struct {
	// MemoHits and MemoMisses count lookups of pieces long enough to be memoised.
	MemoHits, MemoMisses uint64
	// MemoBytes is the memo's current size in the units of [Config].MemoBytes.
	MemoBytes int64
	// MemoEntries is the number of pieces held.
	MemoEntries int
}

// Stats returns the memo's counters, for metrics.
func (t *Tokenizer) Stats() Stats {
	if t.memo == nil {
		return Stats{}
	}
	return t.memo.stats()
}
