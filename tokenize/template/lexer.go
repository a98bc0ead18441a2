package template

import "strings"

// The content-format detection needs only the shape of for and set statements, so it
// reads template tags with this small lexer and chain parser rather than the Jinja
// library's (unexported) syntax tree. The lexer also finds the applications of tojson
// that compile renames to kvroute's bounded filter (bindTojson).

type tokKind uint8

const (
	tokName tokKind = iota + 1
	tokString
	tokNumber
	tokOp
)

type token struct {
	kind tokKind
	// text is a name, an operator, a number's literal or a string's unquoted value.
	text string
	// at and end are the token's offsets in the source (a string's include its quotes).
	at, end int
}

// lex reads the tokens of a tag body starting at from, up to the closer ("%}" or "}}",
// with an optional "-" or "+" before it) at bracket depth 0, skipping a "-" or "+"
// right after the opener. It returns the offset after the closer, or -1 if the tag is
// not closed.
func lex(src string, from int, closer string) ([]token, int) {
	var toks []token
	i := from
	if i < len(src) && (src[i] == '-' || src[i] == '+') {
		i++
	}
	depth := 0
	for i < len(src) {
		c := src[i]
		if depth == 0 {
			if strings.HasPrefix(src[i:], closer) {
				return toks, i + len(closer)
			}
			if (c == '-' || c == '+') && strings.HasPrefix(src[i+1:], closer) {
				return toks, i + 1 + len(closer)
			}
		}
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' && j+1 < len(src) {
					j++
				}
				b.WriteByte(src[j])
				j++
			}
			if j >= len(src) {
				return toks, -1
			}
			toks = append(toks, token{kind: tokString, text: b.String(), at: i, end: j + 1})
			i = j + 1
		case isNameStart(c):
			j := i + 1
			for j < len(src) && (isNameStart(src[j]) || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			toks = append(toks, token{kind: tokName, text: src[i:j], at: i, end: j})
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_' || src[j] == '.' && j+1 < len(src) && src[j+1] >= '0' && src[j+1] <= '9') {
				j++
			}
			toks = append(toks, token{kind: tokNumber, text: src[i:j], at: i, end: j})
			i = j
		default:
			op := string(c)
			for _, two := range []string{"==", "!=", "<=", ">=", "//", "**"} {
				if strings.HasPrefix(src[i:], two) {
					op = two
					break
				}
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			}
			toks = append(toks, token{kind: tokOp, text: op, at: i, end: i + len(op)})
			i += len(op)
		}
	}
	return toks, -1
}

func isNameStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// chainOp is the outermost operation of a parsed chain expression.
type chainOp uint8

const (
	opName      chainOp = iota + 1 // a variable
	opAttr                         // inner.name
	opConstItem                    // inner['name']
	opItem                         // inner[other]
	opSlice                        // inner[a:b]
	opCall                         // inner(…)
	opFilter                       // inner|f(…)
	opTest                         // inner is t
	opOther                        // a constant, a parenthesised non-chain, a literal
)

type chainNode struct {
	op    chainOp
	name  string
	inner *chainNode
}

// parseChain parses a primary (a name, or a parenthesised chain) followed by attribute,
// item, slice, call, filter and test operations, and returns what is left unparsed.
func parseChain(toks []token) (*chainNode, []token, bool) {
	if len(toks) == 0 {
		return nil, toks, false
	}
	var n *chainNode
	switch t := toks[0]; {
	case t.kind == tokName && !isConstName(t.text) && t.text != "not":
		n, toks = &chainNode{op: opName, name: t.text}, toks[1:]
	case t.kind == tokOp && t.text == "(":
		end := closing(toks, 0)
		if end < 0 {
			return nil, nil, false
		}
		inner, rest, ok := parseChain(toks[1:end])
		if !ok || len(rest) > 0 {
			inner = &chainNode{op: opOther}
		}
		n, toks = inner, toks[end+1:]
	default:
		return nil, toks, false
	}
	for len(toks) > 0 {
		t := toks[0]
		switch {
		case t.kind == tokOp && t.text == "." && len(toks) > 1 && toks[1].kind == tokName:
			n, toks = &chainNode{op: opAttr, name: toks[1].text, inner: n}, toks[2:]
		case t.kind == tokOp && t.text == "." && len(toks) > 1 && toks[1].kind == tokNumber:
			n, toks = &chainNode{op: opItem, inner: n}, toks[2:]
		case t.kind == tokOp && t.text == "[":
			end := closing(toks, 0)
			if end < 0 {
				return nil, nil, false
			}
			arg := toks[1:end]
			switch {
			case hasTopLevel(arg, ":"):
				n = &chainNode{op: opSlice, inner: n}
			case len(arg) == 1 && arg[0].kind == tokString:
				n = &chainNode{op: opConstItem, name: arg[0].text, inner: n}
			default:
				n = &chainNode{op: opItem, inner: n}
			}
			toks = toks[end+1:]
		case t.kind == tokOp && t.text == "(":
			end := closing(toks, 0)
			if end < 0 {
				return nil, nil, false
			}
			n, toks = &chainNode{op: opCall, inner: n}, toks[end+1:]
		case t.kind == tokOp && t.text == "|" && len(toks) > 1 && toks[1].kind == tokName:
			toks = toks[2:]
			for len(toks) > 1 && toks[0].text == "." && toks[1].kind == tokName {
				toks = toks[2:]
			}
			if len(toks) > 0 && toks[0].text == "(" {
				end := closing(toks, 0)
				if end < 0 {
					return nil, nil, false
				}
				toks = toks[end+1:]
			}
			n = &chainNode{op: opFilter, inner: n}
		case t.kind == tokName && t.text == "is" && len(toks) > 1 && toks[1].kind == tokName && toks[1].text != "not":
			toks = toks[2:]
			if len(toks) > 0 && toks[0].text == "(" {
				end := closing(toks, 0)
				if end < 0 {
					return nil, nil, false
				}
				toks = toks[end+1:]
			}
			n = &chainNode{op: opTest, inner: n}
		default:
			return n, toks, true
		}
	}
	return n, toks, true
}

// closing returns the index of the bracket closing toks[open], or -1.
func closing(toks []token, open int) int {
	d := 0
	for k := open; k < len(toks); k++ {
		if toks[k].kind != tokOp {
			continue
		}
		switch toks[k].text {
		case "(", "[", "{":
			d++
		case ")", "]", "}":
			d--
			if d == 0 {
				return k
			}
		}
	}
	return -1
}

func hasTopLevel(toks []token, op string) bool {
	for k, t := range toks {
		if t.kind == tokOp && t.text == op && depthAt(toks, k) == 0 {
			return true
		}
	}
	return false
}
