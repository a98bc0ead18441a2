package template

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// resolveWhitespace applies Jinja2's whitespace rules as transformers configures them
// (trim_blocks, lstrip_blocks, no keep_trailing_newline) and the "-" markers to a
// template source, and returns an equivalent source in which no whitespace control is
// left to the Jinja library: text is already trimmed, block tags are written {%+ … +%}
// (which switches the library's own lstrip and trim off) and comments are dropped.
//
// The library applies trim markers and trim_blocks across adjacent tags: in
// "{% endfor %}{%- if %}" its "-" strips the text before {% endfor %}, and in
// "{% if %}{% endif %}\n\n" both tags remove a newline. Jinja2 strips only the text
// between a tag and its neighbour (empty there). Resolving the rules here, the way
// Jinja2's lexer does (jinja2/lexer.py, tokeniter), removes that class of difference.
//
// With bind, the tags' applications of tojson are also renamed to kvroute's bounded
// filters, and those of trim to Python's trim (bindTojson), and each for loop's body
// starts with a call of the render's time budget (stepTag), which prints nothing.
func resolveWhitespace(src string, bind bool) (string, error) {
	// Jinja2 reads \r\n and \r as \n and drops one trailing newline.
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")

	var out strings.Builder
	out.Grow(len(src) + len(src)/8)
	pos := 0
	lineStarting := true
	for pos < len(src) {
		open := nextOpener(src, pos)
		if open < 0 {
			out.WriteString(src[pos:])
			break
		}
		kind := src[open+1]
		marker := byte(0)
		if open+2 < len(src) && (src[open+2] == '-' || src[open+2] == '+') {
			marker = src[open+2]
		}
		raw, rawEnd := rawBegin(src, open)
		text := leftStrip(src[pos:open], marker, kind != '{', lineStarting)
		out.WriteString(text)
		if raw {
			end, err := writeRaw(&out, src, rawEnd, &lineStarting)
			if err != nil {
				return "", err
			}
			pos = end
			continue
		}
		var bodyStart, bodyEnd, closeEnd, next int
		var endMarker byte
		var toks []token
		if kind == '#' {
			// A comment ends at the first "#}", quotes or not.
			bodyStart = open + 2
			k := strings.Index(src[bodyStart:], "#}")
			if k < 0 {
				return "", fmt.Errorf("unclosed comment at byte %d", open)
			}
			bodyEnd, closeEnd = bodyStart+k, bodyStart+k+2
			if bodyEnd > bodyStart && (src[bodyEnd-1] == '-' || src[bodyEnd-1] == '+') {
				endMarker = src[bodyEnd-1]
				bodyEnd--
			}
		} else {
			closer := "}}"
			if kind == '%' {
				closer = "%}"
			}
			toks, next = lex(src, open+2, closer)
			if next < 0 {
				return "", fmt.Errorf("unclosed tag at byte %d", open)
			}
			bodyStart, bodyEnd, closeEnd = open+2, next-len(closer), next
			if marker != 0 {
				bodyStart++
			}
			if bodyEnd > bodyStart && (src[bodyEnd-1] == '-' || src[bodyEnd-1] == '+') && (kind == '%' || src[bodyEnd-1] == '-') {
				endMarker = src[bodyEnd-1]
				bodyEnd--
			}
		}
		body := src[bodyStart:bodyEnd]
		if bind {
			body = bindTojson(src, bodyStart, bodyEnd, toks, kind == '%')
		}
		switch kind {
		case '%':
			out.WriteString("{%+")
			out.WriteString(body)
			out.WriteString("+%}")
			if bind && len(toks) > 0 && toks[0].kind == tokName && toks[0].text == "for" {
				out.WriteString(stepTag)
			}
		case '{':
			out.WriteString("{{")
			out.WriteString(body)
			out.WriteString("}}")
		}
		pos = rightStrip(src, closeEnd, endMarker, kind != '{')
		lineStarting = pos > 0 && src[pos-1] == '\n'
	}
	return out.String(), nil
}

// nextOpener is the offset of the next "{{", "{%" or "{#" at or after pos, or -1.
func nextOpener(src string, pos int) int {
	for {
		k := strings.IndexByte(src[pos:], '{')
		if k < 0 || pos+k+1 >= len(src) {
			return -1
		}
		pos += k
		if c := src[pos+1]; c == '{' || c == '%' || c == '#' {
			return pos
		}
		pos++
	}
}

// leftStrip applies the rules for the text before a tag: "-" strips all its trailing
// white space; otherwise, for a block tag or comment not marked "+", lstrip_blocks
// removes the white space between the last line start and the tag.
func leftStrip(text string, marker byte, block, lineStarting bool) string {
	if marker == '-' {
		return strings.TrimRightFunc(text, isPySpace)
	}
	if marker == '+' || !block {
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if (lpos > 0 || lineStarting) && lpos < len(text) && allSpace(text[lpos:]) {
		return text[:lpos]
	}
	return text
}

// rightStrip returns where the text after a tag starts: "-" skips all white space;
// otherwise trim_blocks skips one newline after a block tag or comment not marked "+".
func rightStrip(src string, pos int, marker byte, block bool) int {
	switch {
	case marker == '-':
		for pos < len(src) {
			r, size := utf8.DecodeRuneInString(src[pos:])
			if !isPySpace(r) {
				break
			}
			pos += size
		}
	case marker != '+' && block && pos < len(src) && src[pos] == '\n':
		pos++
	}
	return pos
}

func allSpace(s string) bool {
	for _, r := range s {
		if !isPySpace(r) {
			return false
		}
	}
	return true
}

// rawBegin reports whether the tag at open is {% raw %} as Jinja2's lexer sees it
// ("{%", an optional marker, "raw", then "-%}" or "%}"), and the offset after it.
func rawBegin(src string, open int) (bool, int) {
	if src[open+1] != '%' {
		return false, 0
	}
	i := open + 2
	if i < len(src) && (src[i] == '-' || src[i] == '+') {
		i++
	}
	i = skipSpace(src, i)
	if !strings.HasPrefix(src[i:], "raw") {
		return false, 0
	}
	i = skipSpace(src, i+3)
	switch {
	case strings.HasPrefix(src[i:], "-%}"):
		return true, rightStrip(src, i+3, '-', true)
	case strings.HasPrefix(src[i:], "%}"):
		return true, i + 2
	}
	return false, 0
}

// writeRaw copies a raw block's content, from start to its {% endraw %}, with the
// left rules applied to the content, and returns the offset after the block.
func writeRaw(out *strings.Builder, src string, start int, lineStarting *bool) (int, error) {
	// line_starting for the content is whether {% raw -%} consumed a newline.
	for i := start; ; {
		k := strings.Index(src[i:], "{%")
		if k < 0 {
			return 0, fmt.Errorf("missing end of raw block at byte %d", start)
		}
		open := i + k
		j := open + 2
		marker := byte(0)
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			marker = src[j]
			j++
		}
		j = skipSpace(src, j)
		if !strings.HasPrefix(src[j:], "endraw") {
			i = open + 2
			continue
		}
		j = skipSpace(src, j+6)
		var endMarker byte
		switch {
		case strings.HasPrefix(src[j:], "+%}"), strings.HasPrefix(src[j:], "-%}"):
			endMarker = src[j]
			j += 3
		case strings.HasPrefix(src[j:], "%}"):
			j += 2
		default:
			i = open + 2
			continue
		}
		rawStart := start > 0 && src[start-1] == '\n'
		out.WriteString("{%+ raw +%}")
		out.WriteString(leftStrip(src[start:open], marker, true, rawStart))
		out.WriteString("{%+ endraw +%}")
		end := rightStrip(src, j, endMarker, true)
		*lineStarting = end > 0 && src[end-1] == '\n'
		return end, nil
	}
}

func skipSpace(src string, i int) int {
	for i < len(src) && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n') {
		i++
	}
	return i
}
