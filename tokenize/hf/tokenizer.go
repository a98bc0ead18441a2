package hf

import (
	"errors"
	"math"
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
	addedIDs     []uint32     // the added tokens' ids, sorted
	normalizer   normalizer   // nil: none
	preTokenizer preTokenizer // nil: none
	model        *bpe
	template     []templatePiece // nil: no post-processor that adds tokens
	// prependFirst: the pipeline prepends to text at offset 0 of the input only, so
	// whether a piece starts the input is part of its memo key.
	prependFirst bool
	// windowed is the pre-tokenizer cut in windows; nil when it cannot be (window.go).
	windowed *windowSplit
	memo     *memo
	// scratches pools the encode buffers (*scratch) of finished calls.
	scratches *sync.Pool
}

var (
	_ tokenize.Tokenizer     = (*Tokenizer)(nil)
	_ tokenize.AppendEncoder = (*Tokenizer)(nil)
	_ tokenize.PrefixEncoder = (*Tokenizer)(nil)
	_ tokenize.AddedTokens   = (*Tokenizer)(nil)
)

// IsAddedToken implements [tokenize.AddedTokens]: whether id is one of the file's
// added_tokens.
func (t *Tokenizer) IsAddedToken(id uint32) bool {
	_, found := slices.BinarySearch(t.addedIDs, id)
	return found
}

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
	b := budget{maxIDs: math.MaxInt, long: math.MaxInt}
	ids, _, err := t.appendEncode(dst, text, addSpecialTokens, &b)
	return ids, err
}

// MaxLongWordBytes bounds the long words one [Tokenizer.AppendEncodePrefix] encodes:
// the bytes, summed, of the words (pre-tokens, as the model sees them) of 256 bytes or
// more, which no cache holds and BPE merges in about 0.2–0.5 µs a byte for Qwen3 and
// 0.6–2.5 µs for Mistral (whose whole pieces are words), against 0.04 µs a byte of
// prose.
// Per word alone it would not bound an encode: 4 MiB cut into 64 KiB words costs what
// one 4 MiB word does. Prompts of words pay nothing of it; a run of one character, a
// DNA sequence or a piece of a model without a pre-tokenizer longer than 256 KiB (64k
// tokens or more) ends the encoded prefix. The library has no such bound.
const MaxLongWordBytes = 256 << 10

// AppendEncodePrefix implements [tokenize.PrefixEncoder]: it appends the ids of text as
// Encode does, stopping once it has appended maxIDs ids (≤ 0: no bound), or before a
// word that would take the long words it encoded past [MaxLongWordBytes]. The ids are
// exactly the first ids of Encode's: each word is encoded on its own, so stopping at a
// word's boundary, or cutting its ids, changes none before. rest is 0 when they are all
// of them, else about the bytes of text left out (at least 1): counted from the start of
// the window of up to 1,024 pre-tokens (or the piece between added tokens, for models
// whose pre-tokenizer does not start with an isolating split) it stopped in.
func (t *Tokenizer) AppendEncodePrefix(dst []uint32, text string, addSpecialTokens bool, maxIDs int) (ids []uint32, rest int, err error) {
	b := budget{maxIDs: math.MaxInt, long: MaxLongWordBytes}
	if maxIDs > 0 && maxIDs <= math.MaxInt-len(dst) { // a larger bound is none
		b.maxIDs = len(dst) + maxIDs
	}
	return t.appendEncode(dst, text, addSpecialTokens, &b)
}

// budget bounds the work left to one encode call.
type budget struct {
	// maxIDs is the length of the ids at which the call stops.
	maxIDs int
	// long is the bytes of long words (maxCachedWord or more) it may still encode.
	long int
}

// appendEncode appends text's ids to dst within b; rest is as AppendEncodePrefix's.
func (t *Tokenizer) appendEncode(dst []uint32, text string, addSpecialTokens bool, b *budget) ([]uint32, int, error) {
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
	ids := slices.Grow(dst, min(len(text)/3+8, b.maxIDs-len(dst)))
	if t.template == nil {
		ids, rest, err := t.encodeBody(text, ids, sc, b)
		return ids, min(rest, len(text)), err
	}
	var err error
	var rest int
	bodyAt, bodyEnd := -1, -1 // the first copy of the body in ids
	for _, p := range t.template {
		switch {
		case !p.sequence:
			if addSpecialTokens {
				ids = append(ids, p.ids...)
			}
		case bodyAt < 0:
			bodyAt = len(ids)
			if ids, rest, err = t.encodeBody(text, ids, sc, b); err != nil || rest > 0 {
				// rest is counted in normalized text, which may be longer.
				return ids, min(rest, len(text)), err
			}
			bodyEnd = len(ids)
		default:
			ids = append(ids, ids[bodyAt:bodyEnd]...)
		}
		if len(ids) > b.maxIDs {
			return ids[:b.maxIDs], 1, nil
		}
	}
	return ids, 0, nil
}

// encodeBody appends the ids of text without post-processing. It and the functions
// below return rest as AppendEncodePrefix does, counted in their own input.
func (t *Tokenizer) encodeBody(text string, ids []uint32, sc *scratch, b *budget) ([]uint32, int, error) {
	var err error
	var rest int
	sc.rawSpans = t.added.raw.split(text, sc.rawSpans[:0])
	for _, sp := range sc.rawSpans {
		if sp.id >= 0 {
			if len(ids) >= b.maxIDs {
				return ids, len(text) - sp.start, nil
			}
			ids = append(ids, uint32(sp.id))
			continue
		}
		if ids, rest, err = t.encodeSegment(text[sp.start:sp.end], sp.start == 0, ids, sc, b); err != nil {
			return nil, 0, err
		}
		if rest > 0 {
			return ids, rest + len(text) - sp.end, nil
		}
	}
	return ids, 0, nil
}

// encodeSegment encodes text between tokens of the raw-text matcher: it is normalized
// as a whole, then cut again by the tokens matched in normalized text. The memo holds
// whole segments when a normalizer runs (a hit skips it), else the pieces between
// normalized-text tokens (which then need no normalizing to be found).
func (t *Tokenizer) encodeSegment(seg string, atStart bool, ids []uint32, sc *scratch, b *budget) ([]uint32, int, error) {
	if seg == "" {
		return ids, 0, nil
	}
	if t.normalizer == nil {
		return t.encodePieces(seg, atStart, ids, true, sc, b)
	}
	return t.memoized(seg, atStart, ids, b, func(ids []uint32) ([]uint32, int, error) {
		normalized, err := t.normalizer.normalize(seg)
		if err != nil {
			return nil, 0, err
		}
		return t.encodePieces(normalized, atStart, ids, false, sc, b)
	})
}

// encodePieces cuts normalized text at the tokens matched in normalized text and
// encodes the pieces between them.
func (t *Tokenizer) encodePieces(s string, atStart bool, ids []uint32, memo bool, sc *scratch, b *budget) ([]uint32, int, error) {
	if t.added.normalized == nil {
		return t.encodePiece(s, atStart, ids, memo, sc, b)
	}
	var err error
	var rest int
	sc.normalizedSpans = t.added.normalized.split(s, sc.normalizedSpans[:0])
	for _, sp := range sc.normalizedSpans {
		if sp.id >= 0 {
			if len(ids) >= b.maxIDs {
				return ids, len(s) - sp.start, nil
			}
			ids = append(ids, uint32(sp.id))
			continue
		}
		if ids, rest, err = t.encodePiece(s[sp.start:sp.end], atStart && sp.start == 0, ids, memo, sc, b); err != nil {
			return nil, 0, err
		}
		if rest > 0 {
			return ids, rest + len(s) - sp.end, nil
		}
	}
	return ids, 0, nil
}

// encodePiece encodes normalized text holding no added token. Its ids depend on nothing
// else (and on atStart only when prependFirst), which is what makes the memo exact.
func (t *Tokenizer) encodePiece(piece string, atStart bool, ids []uint32, memo bool, sc *scratch, b *budget) ([]uint32, int, error) {
	if piece == "" {
		return ids, 0, nil
	}
	if !memo {
		return t.tokenizePiece(piece, atStart, ids, sc, b)
	}
	return t.memoized(piece, atStart, ids, b, func(ids []uint32) ([]uint32, int, error) {
		return t.tokenizePiece(piece, atStart, ids, sc, b)
	})
}

// tokenizePiece pre-tokenizes a piece and encodes its words, a window at a time when
// the pre-tokenizer allows it (window.go).
func (t *Tokenizer) tokenizePiece(piece string, atStart bool, ids []uint32, sc *scratch, b *budget) ([]uint32, int, error) {
	var err error
	var stopped bool
	if t.windowed == nil {
		words := sc.startWords(piece, atStart)
		if t.preTokenizer != nil {
			if words, err = t.preTokenizer.preTokenize(words, sc); err != nil {
				return nil, 0, err
			}
		}
		if ids, stopped, err = t.encodeWords(words, ids, b); err != nil || !stopped {
			return ids, 0, err
		}
		return ids, len(piece), nil
	}
	cut := t.windowed.cut(piece, atStart, sc)
	for {
		words, start, done, err := cut.nextWindow()
		if err != nil || done {
			return ids, 0, err
		}
		if ids, stopped, err = t.encodeWords(words, ids, b); err != nil {
			return nil, 0, err
		}
		if stopped {
			return ids, len(piece) - start, nil
		}
	}
}

// encodeWords appends the ids of words within b. It stops (stopped true) before a word
// once the ids have reached b's bound, or before a long word that would pass b's bound
// of long words; ids past b's bound are cut to it.
func (t *Tokenizer) encodeWords(words []word, ids []uint32, b *budget) (_ []uint32, stopped bool, err error) {
	for _, w := range words {
		if len(ids) >= b.maxIDs {
			return ids[:b.maxIDs], true, nil
		}
		if len(w.text) >= maxCachedWord {
			if len(w.text) > b.long {
				return ids, true, nil
			}
			b.long -= len(w.text)
		}
		if ids, err = t.model.encodeWord(w.text, ids); err != nil {
			return nil, false, err
		}
	}
	if len(ids) > b.maxIDs {
		return ids[:b.maxIDs], true, nil
	}
	return ids, false, nil
}

// memoized appends the ids memoised for key, or computes, appends and memoises them.
// A memoised piece counts against b as encoding it would, so where an encode stops does
// not depend on what the memo holds: a hit that does not fit in b is computed again, up
// to where b stops it. A computed piece that b cut is not memoised.
func (t *Tokenizer) memoized(key string, atStart bool, ids []uint32, b *budget, compute func([]uint32) ([]uint32, int, error)) ([]uint32, int, error) {
	if t.memo == nil {
		return compute(ids)
	}
	if t.prependFirst {
		key = memoKey(key, atStart)
	}
	if hit, long, ok := t.memo.get(key); ok && len(hit) <= b.maxIDs-len(ids) && long <= b.long {
		b.long -= long
		return append(ids, hit...), 0, nil
	}
	start, long := len(ids), b.long
	ids, rest, err := compute(ids)
	if err != nil {
		return nil, 0, err
	}
	if rest == 0 {
		t.memo.put(key, ids[start:], long-b.long)
	}
	return ids, rest, nil
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
