package openai

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// ProbeRender renders and encodes a chat as the model's engine would: its prompt text
// and token ids, or ok false when the chat cannot be rendered (the template refuses it,
// an error).
type ProbeRender func(chat *tokenize.Chat) (text string, ids []uint32, ok bool)

// The probe's texts (vLLM's): each starts and ends with a word of its own, so that the
// segment an inserted message adds starts exactly at it.
const (
	probeSystem     = "Alpha leading instructions"
	probeUser1      = "Bravo first question"
	probeAssistant1 = "Charlie first answer"
	probeUser2      = "Delta second question"
	probeInline     = "Echo inline note"
	probeReasoning  = "Foxtrot prior reasoning"
	probeCallID     = "probe0001"
)

// probeCase is a conversation and where the inline system message goes in it.
type probeCase struct {
	name     string
	messages []jsonv.Value
	index    int
}

func probeCases() []probeCase {
	system := tokenize.TextMessage("system", probeSystem)
	user := tokenize.TextMessage("user", probeUser1)
	call := jsonv.ObjectValue([]string{"id", "type", "function"}, []jsonv.Value{
		jsonv.StringValue(probeCallID), functionType,
		object2("name", jsonv.StringValue("probe_tool"), "arguments", jsonv.StringValue("{}"))})
	assistant := jsonv.ObjectValue([]string{"role", "reasoning", "tool_calls"},
		[]jsonv.Value{assistantRole, jsonv.StringValue(probeReasoning), jsonv.ArrayValue(call)})
	result := jsonv.ObjectValue([]string{"role", "tool_call_id", "content"},
		[]jsonv.Value{toolRole, jsonv.StringValue(probeCallID), jsonv.StringValue("Golf output")})
	return []probeCase{
		{"mid", []jsonv.Value{system, user, tokenize.TextMessage("assistant", probeAssistant1), tokenize.TextMessage("user", probeUser2)}, 3},
		{"after_tool", []jsonv.Value{system, user, assistant, result}, 4},
		{"trailing", []jsonv.Value{system, user}, 2},
	}
}

// probeTool is the probe's request tool.
func probeTool() jsonv.Value {
	params := jsonv.ObjectValue([]string{"type", "properties"}, []jsonv.Value{typeObject, jsonv.ObjectValue(nil, nil)})
	fn := jsonv.ObjectValue([]string{"name", "description", "parameters"},
		[]jsonv.Value{jsonv.StringValue("probe_tool"), jsonv.StringValue("Probe tool."), params})
	return object2("type", functionType, "function", fn)
}

// withoutReasoning is messages without their reasoning.
func withoutReasoning(messages []jsonv.Value) []jsonv.Value {
	out := make([]jsonv.Value, len(messages))
	for i, m := range messages {
		var keys []string
		var vals []jsonv.Value
		for j := range m.Len() {
			if k, v := m.Member(j); k != "reasoning" {
				keys, vals = append(keys, k), append(vals, v)
			}
		}
		out[i] = jsonv.ObjectValue(keys, vals)
	}
	return out
}

func hasReasoning(messages []jsonv.Value) bool {
	return slices.ContainsFunc(messages, func(m jsonv.Value) bool { _, ok := m.Get("reasoning"); return ok })
}

// rendered is a probe chat's prompt.
type rendered struct {
	text string
	ids  []uint32
}

// prober runs vLLM's probe with a model's renderer and tokenizer.
type prober struct {
	render  ProbeRender
	isAdded func(uint32) bool
}

// renderChat renders messages as a chat completion with the probe's tool and effort
// (a string, or null), as readChat builds it.
func (p prober) renderChat(messages []jsonv.Value, effort jsonv.Value) *rendered {
	chat, err := readChat(chatField{v: jsonv.ArrayValue(messages...)}, chatField{v: jsonv.ArrayValue(probeTool())},
		chatField{}, chatField{}, jsonv.Value{}, jsonv.Value{}, effort)
	if err != nil {
		return nil
	}
	text, ids, ok := p.render(chat)
	if !ok {
		return nil
	}
	return &rendered{text, ids}
}

// insertion returns (p, seg) when added == base[:p] + seg + base[p:], found false
// otherwise (vLLM's _insertion).
func insertion(base, added []uint32) (p int, seg []uint32, found bool) {
	n := min(len(base), len(added))
	for p < n && base[p] == added[p] {
		p++
	}
	s := 0
	for s < n-p && base[len(base)-1-s] == added[len(added)-1-s] {
		s++
	}
	if p+s != len(base) {
		return 0, nil, false
	}
	return p, added[p : len(added)-s], true
}

// inserted is a probe chat rendered with a message inserted.
type inserted struct {
	base, added *rendered
	position    int
	segment     []uint32
	found       bool
}

// insert renders message inserted at index, rendering the base again once when the
// insertion test fails and the base renders otherwise the second time (a template
// that writes the current date).
func (p prober) insert(messages []jsonv.Value, base *rendered, index int, message, effort jsonv.Value) inserted {
	with := slices.Concat(messages[:index], []jsonv.Value{message}, messages[index:])
	r := inserted{base: base, added: p.renderChat(with, effort)}
	if r.added != nil {
		r.position, r.segment, r.found = insertion(base.ids, r.added.ids)
	}
	if r.added != nil && !r.found {
		if again := p.renderChat(messages, effort); again != nil && !slices.Equal(again.ids, base.ids) {
			r.base, r.added = again, p.renderChat(with, effort)
			if r.added != nil {
				r.position, r.segment, r.found = insertion(again.ids, r.added.ids)
			}
		}
	}
	return r
}

// check returns why an inline system message is not safe to keep in place in a probe
// case, "" when it is (vLLM's check_case).
func (p prober) check(c probeCase, base *rendered, effort jsonv.Value) string {
	r := p.insert(c.messages, base, c.index, tokenize.TextMessage("system", probeInline), effort)
	switch {
	case r.added == nil:
		return c.name + ": renderer rejects it"
	case !strings.Contains(r.added.text, probeInline):
		return c.name + ": renderer drops it"
	case !r.found:
		return c.name + ": rendering it changes other parts of the prompt"
	case c.index == len(c.messages) && r.position >= len(r.base.ids):
		return c.name + ": it lands after the generation prompt"
	// vLLM counts the text in the segment's ids decoded; kvroute's tokenizers do not
	// decode, so it counts the occurrences the message adds to the prompt's text.
	case strings.Count(r.added.text, probeInline)-strings.Count(r.base.text, probeInline) != 1:
		return c.name + ": it is not rendered as its own segment"
	case !slices.ContainsFunc(r.segment, p.isAdded):
		return c.name + ": it has no role marker"
	}
	if c.name == "mid" {
		u := p.insert(c.messages, r.base, c.index, tokenize.TextMessage("user", probeInline), effort)
		if u.found && slices.Equal(u.segment, r.segment) {
			return c.name + ": it renders the same as a user message"
		}
	}
	if strings.Contains(r.base.text, probeReasoning) != strings.Contains(r.added.text, probeReasoning) {
		return c.name + ": it changes which reasoning is kept"
	}
	return ""
}

// ProbeInlineSystem picks the mode in which vLLM's "auto" places a model's inline
// system messages, by rendering its probe conversations with the model's template and
// tokenizer (render) as vLLM's InlineSystemModeResolver does: preserve when, for
// reasoning_effort "high" and then unset (skipped when it renders the same prompts),
// a system message inserted mid-conversation, after a tool result and at the end
// renders as a segment of its own inserted in the prompt (every other token
// unchanged), before the generation prompt, holding its text once and an added token
// (a role marker), unlike a user message of the same text, and keeping or dropping
// the earlier reasoning as before; fold otherwise, or when the probe conversations do
// not render. isAdded tells the tokenizer's added tokens; nil has none. reason says
// why, as vLLM logs it.
//
// It differs from vLLM's in two ways: kvroute's tokenizers have no decoder, so the
// inline text is looked for in the rendered prompt text rather than in its ids decoded
// (the same for the byte-level tokenizers kvroute loads), and counted as the
// occurrences the inserted message adds to the prompt rather than those in its
// segment's decoded ids (the same unless an occurrence straddles the segment's end);
// and the probe chats render as kvroute renders a chat completion (the server's
// default chat_template_kwargs, which vLLM's probe sees, are not applied).
func ProbeInlineSystem(render ProbeRender, isAdded func(uint32) bool) (mode InlineSystemMode, reason string) {
	if isAdded == nil {
		isAdded = func(uint32) bool { return false }
	}
	p := prober{render: render, isAdded: isAdded}
	cases := probeCases()
	var evaluated [][]uint32
	for _, effort := range []jsonv.Value{jsonv.StringValue("high"), {}} {
		var run []probeCase
		var bases []*rendered
		for _, c := range cases {
			base := p.renderChat(c.messages, effort)
			if base == nil && hasReasoning(c.messages) {
				// Some renderers refuse reasoning in history: probe without it.
				c.messages = withoutReasoning(c.messages)
				base = p.renderChat(c.messages, effort)
			}
			if base == nil {
				break
			}
			run, bases = append(run, c), append(bases, base)
		}
		if len(bases) != len(cases) || sameIDs(bases, evaluated) {
			continue
		}
		evaluated = evaluated[:0]
		for _, b := range bases {
			evaluated = append(evaluated, b.ids)
		}
		for i, c := range run {
			if why := p.check(c, bases[i], effort); why != "" {
				return InlineSystemFold, fmt.Sprintf("%s (reasoning_effort=%s)", why, pyEffort(effort))
			}
		}
	}
	if evaluated == nil {
		return InlineSystemFold, "the probe conversations could not be rendered"
	}
	return InlineSystemPreserve, "the renderer marks them as distinct system turns"
}

func sameIDs(bases []*rendered, evaluated [][]uint32) bool {
	if evaluated == nil || len(bases) != len(evaluated) {
		return false
	}
	for i, b := range bases {
		if !slices.Equal(b.ids, evaluated[i]) {
			return false
		}
	}
	return true
}

// pyEffort is how Python prints the effort in vLLM's reason.
func pyEffort(effort jsonv.Value) string {
	if effort.IsNull() {
		return "None"
	}
	return effort.Str()
}
