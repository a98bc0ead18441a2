package openai

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/jsonv"
)

// Usage is a response's token usage as the engine reported it.
type Usage struct {
	PromptTokens int64
	// CachedTokens is prompt_tokens_details.cached_tokens: prompt tokens served from
	// the engine's prefix cache (0 when not reported).
	CachedTokens int64
}

// MaxUsageTokens is the largest token count a usage object may report: no engine
// serves a prompt of 2³¹ tokens, so larger values are garbage, not load.
const MaxUsageTokens = 1 << 31

// ErrBadUsage is wrapped by the error for a usage object whose values cannot be trusted.
var ErrBadUsage = errors.New("untrustworthy usage")

// ParseUsage finds the last usage object in the tail of a response: the final data
// event of an SSE stream, or the end of a whole JSON body. found is false when there is
// none. It reads the three shapes vLLM writes, and SGLang's:
//   - chat and text completions: prompt_tokens, with prompt_tokens_details.cached_tokens;
//   - the Responses API: input_tokens (every prompt token), with
//     input_tokens_details.cached_tokens;
//   - Anthropic's Messages API: input_tokens, then cache_read_input_tokens and
//     cache_creation_input_tokens, which Anthropic counts apart from input_tokens
//     (vLLM's _build_anthropic_usage subtracts them from its prompt_tokens): the prompt
//     is their sum, the cached tokens cache_read_input_tokens;
//   - SGLang's native generate: the answer's (or last stream chunk's) meta_info, with
//     prompt_tokens and cached_tokens beside each other.
//
// A usage object whose counts are not whole numbers in [0, 2³¹], whose prompt passes
// 2³¹, or whose cached tokens exceed its prompt tokens, is an error wrapping
// [ErrBadUsage]: it must not reach a counter.
func ParseUsage(tail []byte) (u Usage, found bool, err error) {
	at, meta := lastUsageValue(tail)
	if at < 0 {
		return Usage{}, false, nil
	}
	v, err := jsonv.NewDecoder(tail[at:], 8).Value()
	if err != nil || v.Kind() != jsonv.Object {
		// Cut off by the tail's start, or not an object: nothing to read.
		return Usage{}, false, nil
	}
	prompt, ok := v.Get("prompt_tokens")
	if !ok {
		if meta {
			return Usage{}, false, nil
		}
		return inputUsage(v)
	}
	if u.PromptTokens, err = count(prompt, "prompt_tokens"); err != nil {
		return Usage{}, true, err
	}
	cached, name := v, "cached_tokens" // SGLang's meta_info counts them beside the prompt
	if !meta {
		cached, _ = v.Get("prompt_tokens_details")
		name = "prompt_tokens_details.cached_tokens"
	}
	if c, ok := cached.Get("cached_tokens"); ok && !c.IsNull() {
		if u.CachedTokens, err = count(c, name); err != nil {
			return Usage{}, true, err
		}
	}
	if u.CachedTokens > u.PromptTokens {
		return Usage{}, true, fmt.Errorf("%w: cached_tokens %d > prompt_tokens %d", ErrBadUsage, u.CachedTokens, u.PromptTokens)
	}
	return u, true, nil
}

// inputUsage reads a usage object that counts input_tokens (the Responses and
// Anthropic Messages APIs; see ParseUsage); found is false when it has none.
func inputUsage(v jsonv.Value) (u Usage, found bool, err error) {
	input, ok := v.Get("input_tokens")
	if !ok {
		return Usage{}, false, nil
	}
	if u.PromptTokens, err = count(input, "input_tokens"); err != nil {
		return Usage{}, true, err
	}
	// optional reads a count that may be absent or null (0).
	optional := func(v jsonv.Value, key, name string) (int64, error) {
		c, ok := v.Get(key)
		if !ok || c.IsNull() {
			return 0, nil
		}
		return count(c, name)
	}
	read, err := optional(v, "cache_read_input_tokens", "cache_read_input_tokens")
	if err != nil {
		return Usage{}, true, err
	}
	created, err := optional(v, "cache_creation_input_tokens", "cache_creation_input_tokens")
	if err != nil {
		return Usage{}, true, err
	}
	u.PromptTokens += read + created
	u.CachedTokens = read
	if details, ok := v.Get("input_tokens_details"); ok && !details.IsNull() {
		// The Responses API's: its input_tokens already count the cached ones.
		cached, err := optional(details, "cached_tokens", "input_tokens_details.cached_tokens")
		if err != nil {
			return Usage{}, true, err
		}
		u.CachedTokens += cached
	}
	switch {
	case u.PromptTokens > MaxUsageTokens:
		return Usage{}, true, fmt.Errorf("%w: the input tokens add up to %d, past 2^31", ErrBadUsage, u.PromptTokens)
	case u.CachedTokens > u.PromptTokens:
		return Usage{}, true, fmt.Errorf("%w: cached tokens %d > input tokens %d", ErrBadUsage, u.CachedTokens, u.PromptTokens)
	}
	return u, true, nil
}

func count(v jsonv.Value, name string) (int64, error) {
	f, ok := v.Float()
	if !ok {
		// Not a number: name its kind only, since a string would quote the response
		// into the log.
		return 0, fmt.Errorf("%w: %s is a JSON %s, not a whole number in [0, 2^31]", ErrBadUsage, name, v.Kind())
	}
	if math.IsInf(f, 0) || f != math.Trunc(f) || f < 0 || f > MaxUsageTokens {
		return 0, fmt.Errorf("%w: %s is %s, not a whole number in [0, 2^31]", ErrBadUsage, name, v.AppendCompact(nil))
	}
	return int64(f), nil
}

// lastUsageValue returns the offset of the value of the last "usage" or "meta_info"
// member in b, or -1, and whether it is a meta_info. Inside a JSON string a key's
// quotes would be escaped, so a raw `"usage"` followed by a colon is always a member
// name.
func lastUsageValue(b []byte) (at int, meta bool) {
	usage := lastMemberValue(b, []byte(`"usage"`))
	// Only a meta_info after the last usage counts: the tail is searched once, not twice
	// over for a key vLLM's responses never hold.
	from := max(usage, 0)
	if metaInfo := lastMemberValue(b[from:], []byte(`"meta_info"`)); metaInfo >= 0 {
		return from + metaInfo, true
	}
	return usage, false
}

// lastMemberValue returns the offset of the value of the last member named key (its
// quoted name) in b, or -1.
func lastMemberValue(b, key []byte) int {
	for end := len(b); ; {
		i := bytes.LastIndex(b[:end], key)
		if i < 0 {
			return -1
		}
		j := i + len(key)
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			j++
		}
		if j < len(b) && b[j] == ':' {
			return j + 1
		}
		end = i
	}
}
