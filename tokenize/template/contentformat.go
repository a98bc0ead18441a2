package template

import (
	"strings"
)

// DetectContentFormat decides, as vLLM's "auto" content format does
// (_detect_content_format in vllm/entrypoints/chat_utils.py), whether a template loops
// over a message's content: ContentOpenAI if some {% for x in M['content'] %} (or
// M.content, sliced or filtered) iterates the content of a message variable M, where M
// is bound by a for loop over messages or over a variable assigned from messages;
// ContentString otherwise, including where vLLM's analysis gives up (a matching loop or
// assignment whose target is not a plain name).
func DetectContentFormat(source string) ContentFormat {
	var sets, fors []stmt
	for _, s := range statements(source) {
		switch s.kind {
		case "set":
			sets = append(sets, s)
		case "for":
			fors = append(fors, s)
		}
	}
	// Variables holding messages (or slices and filters of them): a BFS over {% set %}.
	related := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for k := 0; k < len(related); k++ {
		for _, s := range sets {
			if !elemsAccess(s.expr, related[k], "") {
				continue
			}
			if s.target == "" {
				return ContentString
			}
			if !seen[s.target] {
				seen[s.target] = true
				related = append(related, s.target)
			}
		}
	}
	var messageVars []string
	for _, s := range fors {
		for _, v := range related {
			if elemsAccess(s.expr, v, "") {
				if s.target == "" {
					return ContentString
				}
				messageVars = append(messageVars, s.target)
				break
			}
		}
	}
	for _, s := range fors {
		for _, v := range messageVars {
			if elemsAccess(s.expr, v, "content") {
				if s.target == "" {
					return ContentString
				}
				return ContentOpenAI
			}
		}
	}
	return ContentString
}

// stmt is a {% for %} or {% set %} statement: its target (empty when it is not a single
// name) and the tokens of its iterable or assigned expression.
type stmt struct {
	kind   string
	target string
	expr   []token
}

// statements returns the for and set statements of a template in source order,
// skipping comments, expressions and raw blocks.
func statements(src string) []stmt {
	var out []stmt
	for i := 0; i < len(src); {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			break
		}
		i += j
		switch src[i+1] {
		case '#':
			end := strings.Index(src[i+2:], "#}")
			if end < 0 {
				return out
			}
			i += 2 + end + 2
		case '{', '%':
			closer := "}}"
			if src[i+1] == '%' {
				closer = "%}"
			}
			toks, next := lex(src, i+2, closer)
			if next < 0 {
				return out
			}
			i = next
			if closer != "%}" || len(toks) == 0 {
				continue
			}
			if toks[0].text == "raw" && len(toks) == 1 {
				end := rawEnd(src, i)
				if end < 0 {
					return out
				}
				i = end
				continue
			}
			if s, ok := parseStmt(toks); ok {
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out
}

// rawEnd returns the offset just past the {% endraw %} that closes a raw block.
func rawEnd(src string, from int) int {
	for i := from; ; {
		j := strings.Index(src[i:], "{%")
		if j < 0 {
			return -1
		}
		toks, next := lex(src, i+j+2, "%}")
		if next < 0 {
			return -1
		}
		if len(toks) == 1 && toks[0].text == "endraw" {
			return next
		}
		i += j + 2
	}
}

// parseStmt reads `for TARGET in EXPR [if …] [recursive]` and `set TARGET = EXPR`.
func parseStmt(toks []token) (stmt, bool) {
	switch toks[0].text {
	case "for":
		in := indexName(toks, "in")
		if in < 0 {
			return stmt{}, false
		}
		expr := toks[in+1:]
		for k := range expr {
			if expr[k].kind == tokName && (expr[k].text == "if" || expr[k].text == "recursive") && depthAt(expr, k) == 0 {
				expr = expr[:k]
				break
			}
		}
		return stmt{kind: "for", target: singleName(toks[1:in]), expr: expr}, true
	case "set":
		for k := 1; k < len(toks); k++ {
			if toks[k].kind == tokOp && toks[k].text == "=" && depthAt(toks, k) == 0 {
				return stmt{kind: "set", target: singleName(toks[1:k]), expr: toks[k+1:]}, true
			}
		}
	}
	return stmt{}, false
}

func indexName(toks []token, name string) int {
	for k, t := range toks {
		if t.kind == tokName && t.text == name && depthAt(toks, k) == 0 {
			return k
		}
	}
	return -1
}

// depthAt is the bracket depth before toks[k].
func depthAt(toks []token, k int) int {
	d := 0
	for _, t := range toks[:k] {
		if t.kind != tokOp {
			continue
		}
		switch t.text {
		case "(", "[", "{":
			d++
		case ")", "]", "}":
			d--
		}
	}
	return d
}

// singleName is the name a target binds, or "" for tuples, namespace attributes and
// anything else that is not one plain name.
func singleName(toks []token) string {
	if len(toks) == 1 && toks[0].kind == tokName && !isConstName(toks[0].text) {
		return toks[0].text
	}
	return ""
}

func isConstName(s string) bool {
	switch s {
	case "true", "false", "none", "True", "False", "None":
		return true
	}
	return false
}

// elemsAccess is vLLM's _is_var_or_elems_access on an expression: with key empty, the
// expression is the variable itself; with a key, it is var[key] or var.key; in both
// cases possibly sliced, filtered or tested (the outer operations are peeled off first).
func elemsAccess(toks []token, varname, key string) bool {
	n, rest, ok := parseChain(toks)
	if !ok || len(rest) > 0 {
		return false
	}
	for {
		switch n.op {
		case opFilter, opTest, opSlice:
			n = n.inner
			continue
		}
		break
	}
	if key == "" {
		return n.op == opName && n.name == varname
	}
	if (n.op == opAttr || n.op == opConstItem) && n.name == key {
		return n.inner.op == opName && n.inner.name == varname
	}
	return false
}
