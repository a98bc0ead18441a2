package template

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// A direct renderer is Go written for one chat template's exact source, used for the
// chats whose every input it handles; any other chat goes through the Jinja library. It
// exists for speed: the Jinja render of a 12-turn chat is most of a decision's time
// (docs/BENCHMARKS.md). Each is held to the library's output by a differential test
// and fuzz target (qwen3_test.go) and to Python's Jinja2 by the committed goldens,
// which render through it.
// It appends the prompt to dst; when it declines (ok false) it may have written into
// dst's spare capacity, never into dst itself.
type directRenderer func(dst []byte, chat *tokenize.Chat) (out []byte, final finalText, ok bool)

// directEnv is what a direct renderer may read besides the chat, fixed when its
// Renderer is built: the special tokens (Llama 3's template writes bos_token) and the
// clock strftime_now reads (Llama 3.2's dates its system turn).
type directEnv struct {
	tokens Tokens
	now    func() time.Time
}

// directRenderers maps the SHA-256 of a template's source to the constructor of its
// direct renderer, which returns nil when the Renderer's environment is one the direct
// renderer does not reproduce. It is never written after initialisation.
var directRenderers = map[string]func(directEnv) directRenderer{
	// Qwen3's chat template (Qwen3-0.6B … Qwen3-235B-A22B, and kvroute's builtin).
	qwen3TemplateSHA256: func(directEnv) directRenderer { return appendQwen3 },
	// Llama 3.1 Instruct's, which Llama 3.3 Instruct carries unchanged (llama3.go).
	llama31TemplateSHA256: newLlama3(llama31),
	// Llama 3.2 Instruct's: the same chats, dated by strftime_now.
	llama32TemplateSHA256: newLlama3(llama32),
	// Llama 3 Instruct's (Meta-Llama-3-8B/70B-Instruct): no system turn, no date.
	llama30TemplateSHA256: newLlama3(llama30),
}

// qwen3TemplateSHA256 is the SHA-256 of Qwen3's chat template source.
const qwen3TemplateSHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

// directRendererFor returns the direct renderer written for source in env, if there is
// one.
func directRendererFor(source string, env directEnv) directRenderer {
	sum := sha256.Sum256([]byte(source))
	if newDirect := directRenderers[hex.EncodeToString(sum[:])]; newDirect != nil {
		return newDirect(env)
	}
	return nil
}

// qwen3Message is a message as Qwen3's template reads it in the chats appendQwen3
// takes: a role and string content, nothing else the template looks at.
type qwen3Message struct {
	role, content string
}

// appendQwen3 appends to dst Qwen3's chat template rendered for a chat without tools:
// every message a system, user, assistant or tool message with string content, no tool
// calls, no reasoning, and chat_template_kwargs setting at most enable_thinking (a kwarg
// null or "auto" sets nothing: vLLM drops it). ok is false for any other chat. The statements it follows are quoted from the template.
func appendQwen3(dst []byte, chat *tokenize.Chat) ([]byte, finalText, bool) {
	if chat.Tools != nil {
		return nil, finalText{}, false
	}
	thinkingOff := false
	if kw := chat.TemplateKwargs; kw.Kind() == jsonv.Object {
		for i := range kw.Len() {
			key, v := kw.Member(i)
			if unsetKwarg(v) {
				continue // dropped, as mergeKwargs drops it
			}
			if key != "enable_thinking" {
				return nil, finalText{}, false
			}
			// {%- if enable_thinking is defined and enable_thinking is false %}: only
			// the boolean false (a later duplicate key wins, as in mergeKwargs).
			thinkingOff = v.Kind() == jsonv.False
		}
	} else if kw.Kind() != jsonv.Null {
		return nil, finalText{}, false
	}
	msgs := make([]qwen3Message, len(chat.Messages))
	size := 64
	for i, m := range chat.Messages {
		if m.Kind() != jsonv.Object {
			return nil, finalText{}, false
		}
		role, _ := m.Get("role")
		content, _ := m.Get("content")
		if role.Kind() != jsonv.String || content.Kind() != jsonv.String {
			return nil, finalText{}, false
		}
		switch role.Str() {
		case "system", "user", "tool":
		case "assistant":
			if calls, ok := m.Get("tool_calls"); ok && !calls.IsNull() {
				return nil, finalText{}, false
			}
			if _, ok := reasoning(m); ok {
				return nil, finalText{}, false
			}
		default:
			return nil, finalText{}, false
		}
		msgs[i] = qwen3Message{role: role.Str(), content: content.Str()}
		size += len(msgs[i].content) + 48
	}

	b := slices.Grow(dst, size)
	// {%- if messages[0].role == 'system' %} (the branch without tools)
	if msgs[0].role == "system" {
		b = append(b, "<|im_start|>system\n"...)
		b = append(b, msgs[0].content...)
		b = append(b, "<|im_end|>\n"...)
	}
	// The last user message that is not a tool response: assistant turns after it keep
	// their reasoning.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		c := msgs[i].content
		if msgs[i].role == "user" && !(strings.HasPrefix(c, "<tool_response>") && strings.HasSuffix(c, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range msgs {
		last := i == len(msgs)-1
		switch {
		case m.role == "user" || m.role == "system" && i > 0:
			b = append(b, "<|im_start|>"...)
			b = append(b, m.role...)
			b = append(b, "\n"...)
			b = append(b, m.content...)
			b = append(b, "<|im_end|>\n"...)
		case m.role == "assistant":
			content, reasoning := m.content, ""
			if end := strings.Index(m.content, "</think>"); end >= 0 {
				// content.split('</think>')[-1].lstrip('\n') and
				// content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
				content = strings.TrimLeft(m.content[strings.LastIndex(m.content, "</think>")+len("</think>"):], "\n")
				before := strings.TrimRight(m.content[:end], "\n")
				if start := strings.LastIndex(before, "<think>"); start >= 0 {
					before = before[start+len("<think>"):]
				}
				reasoning = strings.TrimLeft(before, "\n")
			}
			if i > lastQuery && (last || reasoning != "") {
				b = append(b, "<|im_start|>assistant\n<think>\n"...)
				b = append(b, strings.Trim(reasoning, "\n")...)
				b = append(b, "\n</think>\n\n"...)
				b = append(b, strings.TrimLeft(content, "\n")...)
			} else {
				b = append(b, "<|im_start|>assistant\n"...)
				b = append(b, content...)
			}
			b = append(b, "<|im_end|>\n"...)
		case m.role == "tool":
			if i == 0 || msgs[i-1].role != "tool" {
				b = append(b, "<|im_start|>user"...)
			}
			b = append(b, "\n<tool_response>\n"...)
			b = append(b, m.content...)
			b = append(b, "\n</tool_response>"...)
			if last || msgs[i+1].role != "tool" {
				b = append(b, "<|im_end|>\n"...)
			}
		}
	}
	if chat.AddGenerationPrompt {
		b = append(b, "<|im_start|>assistant\n"...)
		if thinkingOff {
			b = append(b, "<think>\n\n</think>\n\n"...)
		}
	}
	return b, finalText{text: msgs[len(msgs)-1].content, ok: true}, true
}
