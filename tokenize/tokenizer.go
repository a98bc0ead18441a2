package tokenize

import (
	"slices"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// Tokenizer turns prompt text into token ids. addSpecialTokens applies the tokenizer's
// post-processor (e.g. a leading BOS), as engines do for completions prompts but not for
// rendered chats, whose template writes its special tokens as text. Implementations must
// be deterministic and safe for concurrent use. The returned slice belongs to the caller.
type Tokenizer interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
}

// AppendEncoder is a [Tokenizer] that can append its ids to the caller's buffer, which
// [Pipeline] uses when the caller brings [Buffers].
type AppendEncoder interface {
	AppendEncode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, error)
}

// AddedTokens is a [Tokenizer] that tells its added tokens (tokenizer.json's
// added_tokens, special or not: what a Hugging Face tokenizer's get_added_vocab and
// all_special_ids give), which chat templates write as role markers.
type AddedTokens interface {
	IsAddedToken(id uint32) bool
}

// PrefixEncoder is a [Tokenizer] that can encode a prompt's beginning only, bounding
// the work of a long or hostile text: [Pipeline] uses it when it has a bound.
type PrefixEncoder interface {
	// AppendEncodePrefix appends Encode's ids of text to dst, or exactly their first
	// ones: it stops once it has appended maxIDs (≤ 0: no bound), and may stop sooner at
	// a bound of its own on the work of one text. rest is 0 when the ids are all of
	// text's; else it is about the bytes of text they leave out, at least 1.
	AppendEncodePrefix(dst []uint32, text string, addSpecialTokens bool, maxIDs int) (ids []uint32, rest int, err error)
}

// ApproxVocabSize is the number of distinct ids [Approx] produces.
const ApproxVocabSize = 1 << 17

// approxMaxPieceBytes caps a piece so long runs (base64, minified code) still come out
// near the four bytes per token that real BPE vocabularies average on English text.
const approxMaxPieceBytes = 4

// Approx is a deterministic, file-free tokenizer. It cuts text GPT-2 style into pieces
// (a run of letters or digits with at most one leading space, or any other single rune),
// splits pieces longer than four bytes, and hashes each piece to an id below
// [ApproxVocabSize]. Token counts are within a small factor of real tokenizers on prose;
// the ids themselves match no engine. The zero value is ready to use.
type Approx struct{}

var (
	_ Tokenizer     = Approx{}
	_ PrefixEncoder = Approx{}
)

// Encode implements [Tokenizer]. It has no special tokens, so addSpecialTokens changes
// nothing, and it never fails.
func (a Approx) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	ids, _, err := a.AppendEncodePrefix(nil, text, addSpecialTokens, 0)
	return ids, err
}

// AppendEncodePrefix implements [PrefixEncoder]. Its work is linear in the bytes it
// reads, so maxIDs is its only bound; rest is exact.
func (Approx) AppendEncodePrefix(dst []uint32, text string, _ bool, maxIDs int) ([]uint32, int, error) {
	limit := len(text)/3 + 1
	if maxIDs > 0 {
		limit = min(limit, maxIDs)
	}
	ids := slices.Grow(dst, limit)
	for start := 0; start < len(text); {
		end := pieceEnd(text, start)
		for start < end {
			if maxIDs > 0 && len(ids)-len(dst) == maxIDs {
				return ids, len(text) - start, nil
			}
			cut := min(end, start+approxMaxPieceBytes)
			// Do not split inside a multi-byte rune: back off to its first byte.
			for cut < end && cut > start+1 && !utf8.RuneStart(text[cut]) {
				cut--
			}
			ids = append(ids, uint32(xxh3.HashString(text[start:cut])%ApproxVocabSize))
			start = cut
		}
	}
	return ids, 0, nil
}

// pieceEnd returns the end of the piece that starts at byte offset start.
func pieceEnd(text string, start int) int {
	i := start
	if text[i] == ' ' {
		i++
	}
	j := i
	for j < len(text) {
		r, size := utf8.DecodeRuneInString(text[j:])
		if !isWordRune(r) {
			break
		}
		j += size
	}
	if j > i {
		return j
	}
	if i > start { // a lone space followed by a non-word rune
		return i
	}
	_, size := utf8.DecodeRuneInString(text[i:])
	return i + size
}

func isWordRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r >= 0x80 && r != utf8.RuneError
}
