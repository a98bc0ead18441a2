package openai

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/kvroute/kvroute/jsonv"
)

// InlineSystemMode is how vLLM places an Anthropic Messages request's inline system
// messages (role "system" after the conversation's start, which Claude Code appends on
// almost every turn): vLLM's AnthropicInlineSystemMode. The server's option
// (AnthropicInlineSystemOption, the inline_system argument of its Messages handler)
// adds "auto", its default: probe the chat template once and pick one of the two.
type InlineSystemMode string

const (
	// InlineSystemPreserve keeps inline system messages in place, as system turns
	// (moved out of a tool_use's run of results), when the request has a system prompt
	// or leading system text; else it folds.
	InlineSystemPreserve InlineSystemMode = "preserve"
	// InlineSystemFold merges their text into a neighbouring message.
	InlineSystemFold InlineSystemMode = "fold"
)

// placedBytes is the size of a placed.
const placedBytes = int(unsafe.Sizeof(placed{}))

// placed is an Anthropic message as normalizeInlineSystem places it, with the index of
// the message it comes from in the request's messages (for errors).
type placed struct {
	m jsonv.Value
	i int
}

// inlineSystem reads where a request's system messages are: n, the count of those that
// lead messages; leading, their texts joined with "\n\n" (normalize_inline_system's
// first result); and inline, whether a later one has text (else both modes give the
// chat of the messages without them).
func inlineSystem(messages []jsonv.Value) (n int, leading []string, inline bool) {
	for n < len(messages) && messageRole(messages[n]) == "system" {
		leading = append(leading, systemText(messages[n]))
		n++
	}
	for _, m := range messages[n:] {
		if messageRole(m) == "system" && systemText(m) != "" {
			return n, leading, true
		}
	}
	return n, leading, false
}

func messageRole(m jsonv.Value) string {
	role, _ := m.Get("role")
	return role.Str()
}

// moveOutOfToolRuns is vLLM's _move_out_of_tool_runs: a system message between an
// assistant message with a tool_use block and the message that follows it (the user's
// tool results) moves after that message, so that nothing comes between a tool call
// and its result. Of messages[first:], indexed from first.
func moveOutOfToolRuns(messages []jsonv.Value, first int) []placed {
	out := make([]placed, 0, len(messages))
	var held []placed
	awaiting := false
	for j, m := range messages {
		p := placed{m, first + j}
		role := messageRole(m)
		if role == "system" {
			if awaiting {
				if held == nil {
					// Sized to what may follow, so that it never grows: the caller charges
					// one list of the messages for it.
					held = make([]placed, 0, len(messages)-j)
				}
				held = append(held, p)
			} else {
				out = append(out, p)
			}
			continue
		}
		if role == "assistant" {
			out, held = append(out, held...), held[:0]
		}
		out = append(out, p)
		if role == "user" {
			out, held = append(out, held...), held[:0]
		}
		awaiting = role == "assistant" && hasToolUse(m)
	}
	return append(out, held...)
}

// hasToolUse reports whether a message's content is a list holding a tool_use block.
func hasToolUse(m jsonv.Value) bool {
	content, _ := m.Get("content")
	for _, b := range content.Items() {
		if blockType(b) == "tool_use" {
			return true
		}
	}
	return false
}

func blockType(b jsonv.Value) string {
	typ, _ := b.Get("type")
	return typ.Str()
}

// normalizeInlineSystem is vLLM's normalize_inline_system for messages[n:] (n the
// leading system messages, whose text the caller puts in the system prompt): the
// messages to convert, in mode, for a request whose system prompt or leading system
// text is not empty when hasSystem.
//
//   - System messages between a tool_use and its results move after them
//     (moveOutOfToolRuns), in both modes.
//   - preserve, when hasSystem, keeps them there: each is converted to a system
//     message of its text (none when the text is empty).
//   - fold (and preserve without a system prompt, since some renderers render the
//     request's tools at the first system message wherever it is): a system message
//     without text is dropped; one whose text follows a user message with no text
//     pending is appended to that user message (appendToUser); else its text is pending,
//     and the pending texts, joined with "\n\n", are put before the text of the next
//     user message (addText), or are a user message of their own before the next
//     assistant message, or at the end.
//
// The texts it joins are charged to c.
func (c *messagesConversion) normalizeInlineSystem(messages []jsonv.Value, n int, mode InlineSystemMode, hasSystem bool) ([]placed, error) {
	// The placed lists: moveOutOfToolRuns' (with what it holds) and fold's.
	if err := c.charge(3 * placedBytes * (len(messages) - n)); err != nil {
		return nil, err
	}
	rest := moveOutOfToolRuns(messages[n:], n)
	if mode == InlineSystemPreserve && hasSystem {
		return rest, nil
	}
	out := make([]placed, 0, len(rest))
	var pending []string
	for _, p := range rest {
		if messageRole(p.m) == "system" {
			text := systemText(p.m)
			if text == "" {
				continue
			}
			if len(out) > 0 && messageRole(out[len(out)-1].m) == "user" && len(pending) == 0 {
				last := &out[len(out)-1]
				m, err := c.appendToUser(last.m, text)
				if err != nil {
					return nil, fmt.Errorf("messages[%d]: %w", last.i, err)
				}
				last.m = m
			} else {
				pending = append(pending, text)
			}
			continue
		}
		if len(pending) > 0 {
			text, err := c.joinPending(pending)
			if err != nil {
				return nil, err
			}
			pending = pending[:0]
			if messageRole(p.m) == "user" {
				content, _ := p.m.Get("content")
				folded, err := c.addText(content, text, false)
				if err != nil {
					return nil, fmt.Errorf("messages[%d]: %w", p.i, err)
				}
				p.m = object2("role", userRole, "content", folded)
			} else {
				out = append(out, placed{object2("role", userRole, "content", jsonv.StringValue(text)), p.i})
			}
		}
		out = append(out, p)
	}
	if len(pending) > 0 {
		text, err := c.joinPending(pending)
		if err != nil {
			return nil, err
		}
		out = append(out, placed{object2("role", userRole, "content", jsonv.StringValue(text)), len(messages)})
	}
	return out, nil
}

// joinPending joins the pending texts, charging the result and its message.
func (c *messagesConversion) joinPending(texts []string) (string, error) {
	size := 0
	for _, t := range texts {
		size += len(t) + 2
	}
	if err := c.charge(size + 8*valueBytes); err != nil {
		return "", err
	}
	return joinNonEmpty(texts...), nil
}

// appendToUser is vLLM's _append_to_user: text appended to a user message's own text
// or, when its content is nothing but tool_result blocks, to the last tool result's
// content, so that folding never adds a user turn after tool results. Its other blocks
// keep their order after its tool results (which become tool messages before it, in
// order, either way).
func (c *messagesConversion) appendToUser(m jsonv.Value, text string) (jsonv.Value, error) {
	// The message's object.
	if err := c.charge(6 * valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	content, _ := m.Get("content")
	if content.Kind() == jsonv.String {
		folded, err := c.addText(content, text, true)
		return object2("role", userRole, "content", folded), err
	}
	blocks := content.Items()
	if err := c.charge(2 * valueBytes * (len(blocks) + 2)); err != nil {
		return jsonv.Value{}, err
	}
	allResults := len(blocks) > 0
	for _, b := range blocks {
		allResults = allResults && blockType(b) == "tool_result"
	}
	var out []jsonv.Value
	if allResults {
		last := blocks[len(blocks)-1]
		inner, _ := last.Get("content")
		folded, err := c.addText(inner, text, true)
		if err != nil {
			return jsonv.Value{}, err
		}
		out = append(slices.Clip(blocks[:len(blocks)-1]), withMember(last, "content", folded))
	} else {
		// One list of the blocks, sized once: its tool results, then its own blocks,
		// which the text joins (addText copies them) and which are then replaced by
		// those addText returns.
		out = make([]jsonv.Value, 0, len(blocks)+1)
		for _, b := range blocks {
			if blockType(b) == "tool_result" {
				out = append(out, b)
			}
		}
		results := len(out)
		for _, b := range blocks {
			if blockType(b) != "tool_result" {
				out = append(out, b)
			}
		}
		folded, err := c.addText(jsonv.ArrayValue(out[results:]...), text, true)
		if err != nil {
			return jsonv.Value{}, err
		}
		out = append(out[:results], folded.Items()...)
	}
	return object2("role", userRole, "content", jsonv.ArrayValue(out...)), nil
}

// addText is vLLM's _add_text: text joined ("\n\n", empty texts left out) onto the
// text at one end of content, a string or null (a string results) or a list of blocks
// or tool-result items (a list results), whose end item, when of type text, takes it
// in its text (some templates join text blocks with no separator), else a new text
// item {"type":"text","text"} is added at that end.
func (c *messagesConversion) addText(content jsonv.Value, text string, atEnd bool) (jsonv.Value, error) {
	join := func(old string) (jsonv.Value, error) {
		if err := c.charge(len(old) + len(text) + 2 + 4*valueBytes); err != nil {
			return jsonv.Value{}, err
		}
		if atEnd {
			return jsonv.StringValue(joinNonEmpty(old, text)), nil
		}
		return jsonv.StringValue(joinNonEmpty(text, old)), nil
	}
	switch content.Kind() {
	case jsonv.Null, jsonv.String:
		return join(content.Str())
	case jsonv.Array:
	default:
		return jsonv.Value{}, messagesNotRendered("content must be a string or a list of blocks")
	}
	items := content.Items()
	if err := c.charge(2 * valueBytes * (len(items) + 1)); err != nil {
		return jsonv.Value{}, err
	}
	end := 0
	if atEnd {
		end = len(items) - 1
	}
	if len(items) > 0 && blockType(items[end]) == "text" {
		old, _ := items[end].Get("text")
		if old.Kind() != jsonv.Null && old.Kind() != jsonv.String {
			// Python's join fails on it.
			return jsonv.Value{}, messagesNotRendered("a text item's text must be a string")
		}
		joined, err := join(old.Str())
		if err != nil {
			return jsonv.Value{}, err
		}
		out := slices.Clone(items)
		out[end] = withMember(items[end], "text", joined)
		return jsonv.ArrayValue(out...), nil
	}
	if err := c.charge(8 * valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	item := object2("type", textType, "text", jsonv.StringValue(text))
	if atEnd {
		return jsonv.ArrayValue(append(slices.Clip(items), item)...), nil
	}
	return jsonv.ArrayValue(append([]jsonv.Value{item}, items...)...), nil
}

// withMember is the object o with key set to v: in its place when o has it, else last
// (Python's {**o, key: v}).
func withMember(o jsonv.Value, key string, v jsonv.Value) jsonv.Value {
	n := o.Len()
	keys, vals := make([]string, 0, n+1), make([]jsonv.Value, 0, n+1)
	set := false
	for i := range n {
		k, old := o.Member(i)
		if k == key {
			if set {
				continue // a duplicate key: the object holds the last, now v
			}
			old, set = v, true
		}
		keys, vals = append(keys, k), append(vals, old)
	}
	if !set {
		keys, vals = append(keys, key), append(vals, v)
	}
	return jsonv.ObjectValue(keys, vals)
}
