package template

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hostileFragments add to qwen3Fragments what string methods and the request parser
// may treat apart: other whitespace and line breaks, control and non-ASCII bytes, tag
// prefixes.
var hostileFragments = append([]string{"\r\n", "\t", "<think>\n", "\n</think>", "</think", "<think",
	"<tool_response>x</tool_response>", "\u2028", "\u0085", "\u3000", "\x00", "\x7f", "<|im_start|>"}, qwen3Fragments...)

func hostileText(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(6) {
		b.WriteString(hostileFragments[rng.IntN(len(hostileFragments))])
	}
	return b.String()
}

func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// hostileValue is a JSON value of any kind an extra key or a kwarg might carry.
func hostileValue(rng *rand.Rand) string {
	values := []string{"null", "false", "true", "0", `"false"`, "[]", "{}", `[{"type":"text","text":"hi"}]`}
	if i := rng.IntN(len(values) + 1); i < len(values) {
		return values[i]
	}
	return jsonString(hostileText(rng))
}

// hostileQwen3Body is a chat request body written by hand, so that it may repeat keys:
// messages with random roles (developer included), texts and extra keys the template
// or vLLM's preparation reads (reasoning, reasoning_content, tool_calls, name…) holding
// values of every kind, and chat_template_kwargs setting enable_thinking and other keys
// to values of every kind.
func hostileQwen3Body(rng *rand.Rand) []byte {
	return hostileBody(rng, hostileBodySpec{
		model:   "qwen3",
		roles:   []string{"system", "user", "assistant", "tool", "user", "assistant", "developer"},
		keys:    []string{"name", "reasoning", "reasoning_content", "tool_calls", "tool_call_id", "content", "role", "task"},
		content: func(rng *rand.Rand) string { return jsonString(hostileText(rng)) },
		kwargs:  []string{"enable_thinking", "enable_thinking", "add_generation_prompt", "tools", "other"},
	})
}

// hostileBodySpec is what one template's hostile request bodies draw from: the roles,
// the extra message keys (given values of every kind), a message's content (JSON), and
// the chat_template_kwargs keys.
type hostileBodySpec struct {
	model       string
	roles, keys []string
	content     func(rng *rand.Rand) string
	kwargs      []string
}

// hostileBody writes a chat request body by hand, so that it may repeat keys: 1 to 8
// messages of spec's roles and content with up to 2 extra keys each, in random order;
// add_generation_prompt off, or off with continue_final_message, a quarter of the time
// each; chat_template_kwargs with up to 2 of spec's keys half the time; an empty tools
// list an eighth of the time.
func hostileBody(rng *rand.Rand, spec hostileBodySpec) []byte {
	msgs := make([]string, 1+rng.IntN(8))
	for i := range msgs {
		members := []string{`"role":` + jsonString(spec.roles[rng.IntN(len(spec.roles))]), `"content":` + spec.content(rng)}
		for range rng.IntN(3) {
			k, v := spec.keys[rng.IntN(len(spec.keys))], hostileValue(rng)
			if k == "role" {
				v = jsonString(spec.roles[rng.IntN(len(spec.roles))])
			}
			members = append(members, jsonString(k)+":"+v)
		}
		rng.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		msgs[i] = "{" + strings.Join(members, ",") + "}"
	}
	body := `{"model":` + jsonString(spec.model) + `,"messages":[` + strings.Join(msgs, ",") + `]`
	switch rng.IntN(4) {
	case 0:
		body += `,"add_generation_prompt":false`
	case 1:
		body += `,"add_generation_prompt":false,"continue_final_message":true`
	}
	if rng.IntN(2) == 0 {
		var members []string
		for range rng.IntN(3) {
			members = append(members, jsonString(spec.kwargs[rng.IntN(len(spec.kwargs))])+":"+hostileValue(rng))
		}
		body += `,"chat_template_kwargs":{` + strings.Join(members, ",") + `}`
	}
	if rng.IntN(8) == 0 {
		body += `,"tools":[]`
	}
	return []byte(body + "}")
}

// TestQwen3DirectRendererMatchesJinjaOnHostileMessages holds the direct renderer to the
// Jinja library, error text included, on request bodies with repeated keys, extra keys
// of every kind and kwargs of every kind, and on chats built in Go whose texts are
// invalid UTF-8 (which the request parser refuses, but a renderer may be handed).
func TestQwen3DirectRendererMatchesJinjaOnHostileMessages(t *testing.T) {
	direct, interpreted := qwen3Pair(t)
	rng := rand.New(rand.NewPCG(11, 11))
	took, parsed := renderBodies(t, direct, interpreted, 20000, func() []byte { return hostileQwen3Body(rng) })
	t.Logf("direct renderer took %d of %d hostile bodies", took, parsed)
	require.Greater(t, took, parsed/5)

	invalid := append([]string{"\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf0\x9f\x99"}, hostileFragments...)
	renderInvalidTextChats(t, direct, interpreted, rng, 5000, invalid, []string{"system", "user", "assistant", "tool"})
}
