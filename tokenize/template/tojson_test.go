package template

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/openai"
)

// TestBindTojsonRenamesOnlyTheFilter pins which uses of tojson compile renames: the
// filter after "|" and in a filter block, and map('tojson', …) unless map is given
// attribute=; never a variable, an attribute, a string or a raw block. The trim filter
// is renamed the same way.
func TestBindTojsonRenamesOnlyTheFilter(t *testing.T) {
	tests := []struct{ src, want string }{
		{`{{ x | tojson }}`, `{{ x | __kvroute_tojson }}`},
		{`{{- x|tojson(indent=4) -}}`, `{{ x|__kvroute_tojson(indent=4) }}`},
		{`{{ x | trim | tojson | safe }}`, `{{ x | __kvroute_trim | __kvroute_tojson | safe }}`},
		{`{% filter trim %} a {% endfilter %}{{ x|trim('\n') }}`, `{%+ filter __kvroute_trim +%} a {%+ endfilter +%}{{ x|__kvroute_trim('\n') }}`},
		{`{% set y = (x | tojson) + ', ' + (z|tojson) %}`, `{%+ set y = (x | __kvroute_tojson) + ', ' + (z|__kvroute_tojson) +%}`},
		{`{% filter tojson %}a{% endfilter %}`, `{%+ filter __kvroute_tojson +%}a{%+ endfilter +%}`},
		{`{%- filter upper | tojson -%}a{% endfilter %}`, `{%+ filter upper | __kvroute_tojson +%}a{%+ endfilter +%}`},
		{`{{ x | map('tojson') | join(',') }}`, `{{ x | __kvroute_map_tojson() | join(',') }}`},
		{`{{ x | map("tojson", indent=2) | list }}`, `{{ x | __kvroute_map_tojson( indent=2) | list }}`},
		{`{{ x | map('tojson', f(attribute=1)) }}`, `{{ x | __kvroute_map_tojson( f(attribute=1)) }}`},
		// Left alone.
		{`{{ x | map('tojson', attribute='a') }}`, `{{ x | map('tojson', attribute='a') }}`},
		{`{{ x | map('to\json') }}`, `{{ x | map('to\json') }}`},
		{`{{ x | map(attribute='tojson') }}`, `{{ x | map(attribute='tojson') }}`},
		{`{{ tojson }}{{ x.tojson }}{{ 'a | tojson' }}{{ x | tojson.y }}`, `{{ tojson }}{{ x.tojson }}{{ 'a | tojson' }}{{ x | tojson.y }}`},
		{`{% set tojson = 1 %}{% if x is tojson %}{% endif %}`, `{%+ set tojson = 1 +%}{%+ if x is tojson +%}{%+ endif +%}`},
		{`{% raw %}{{ x | tojson }}{% endraw %}`, `{%+ raw +%}{{ x | tojson }}{%+ endraw +%}`},
		{`{# x | tojson #}{{ x | tojsonx }}`, `{{ x | tojsonx }}`},
		{`{{ trim }}{{ x.trim }}{{ 'a | trim' }}{{ x | trimx }}`, `{{ trim }}{{ x.trim }}{{ 'a | trim' }}{{ x | trimx }}`},
	}
	for _, tt := range tests {
		got, err := resolveWhitespace(tt.src, true)
		require.NoError(t, err, tt.src)
		assert.Equal(t, tt.want, got, tt.src)
		plain, err := resolveWhitespace(tt.src, false)
		require.NoError(t, err, tt.src)
		assert.Equal(t, strings.NewReplacer(mapTojsonFilter+"( ", "map('tojson', ", mapTojsonFilter+"(", "map('tojson'", tojsonFilter, "tojson", trimFilter, "trim").Replace(got),
			strings.ReplaceAll(plain, `"tojson", `, `'tojson', `), "without bind, the same source but for the names")
	}
}

// renderBoth renders src with data through the bounded tojson (budget bytes) and the
// library's own, and returns both outputs and errors.
func renderBoth(t *testing.T, src string, data map[string]jinja.Value, budget int) (bound, lib string, boundErr, libErr error, b *jsonBudget) {
	t.Helper()
	bt, err := compileSource(src, true)
	require.NoError(t, err, src)
	lt, err := compileSource(src, false)
	require.NoError(t, err, src)
	withBudget := make(map[string]jinja.Value, len(data)+2)
	for k, v := range data {
		withBudget[k] = v
	}
	b = &jsonBudget{left: budget}
	b.bind(withBudget)
	bound, boundErr = execute(bt, withBudget)
	lib, libErr = execute(lt, data)
	return bound, lib, boundErr, libErr, b
}

// tojsonValues are values tojson must print as the library does: every kind, floats in
// each of Python's formats, strings with escapes, DEL, invalid UTF-8 and runes beyond
// the BMP, containers empty and nested, shared but not cyclic.
func tojsonValues() map[string]jinja.Value {
	shared := jinja.NewList([]jinja.Value{jinja.NewInt(1)})
	d := jinja.NewDict()
	d.AsDict().Set("z", jinja.NewList([]jinja.Value{shared, shared, jinja.NewDict(), jinja.NewList(nil)}))
	d.AsDict().Set("a\"é", jinja.NewFloat(-0.0))
	d.AsDict().Set("m", jinja.None())
	d.AsDict().Data["ghost"] = jinja.NewInt(3) // in Data, not Keys: never printed
	d.AsDict().Keys = append(d.AsDict().Keys, "missing")
	vals := map[string]jinja.Value{
		"none": jinja.None(), "undefined": jinja.Undefined(), "true": jinja.NewBool(true), "false": jinja.NewBool(false),
		"callable": jinja.NewCallable("f", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) { return jinja.None(), nil }),
		"ints":     jinja.NewList([]jinja.Value{jinja.NewInt(0), jinja.NewInt(-7), jinja.NewInt(math.MaxInt64), jinja.NewInt(math.MinInt64)}),
		"dict":     d,
		"string":   jinja.NewString("q\"b\\s/\b\f\n\r\t\x00\x1f\x7f é € 😀 \u2028 \xff\xfe end"),
		"empty":    jinja.NewString(""),
	}
	var floats []jinja.Value
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -2.5, 1e15, 1e16, 123456789012345678, 1e-4, 9.99e-5, 1e-300, 1.7976931348623157e308,
		0.1 + 0.2, math.NaN(), math.Inf(1), math.Inf(-1), 5e-324} {
		floats = append(floats, jinja.NewFloat(f))
	}
	vals["floats"] = jinja.NewList(floats)
	vals["all"] = jinja.NewList([]jinja.Value{vals["dict"], vals["string"], vals["floats"], vals["ints"], jinja.NewList([]jinja.Value{jinja.NewList([]jinja.Value{jinja.NewString("deep")})})})
	return vals
}

// tojsonArgs are argument lists of tojson calls, by keyword and by position.
var tojsonArgs = []string{
	``, `()`, `(indent=4)`, `(indent=0)`, `(indent=-3)`, `(indent=2.9)`, `(indent=true)`, `(indent=none)`, `(indent='\t')`,
	`(indent='→ ')`, `(indent=[1])`, `(separators=[',', ':'])`, `(separators=['; ', ' = '])`, `(separators=['、', '：'], indent=1)`,
	`(sort_keys=true)`, `(sort_keys=1, indent=2)`, `(ensure_ascii=true)`, `(ensure_ascii=true, indent='→', separators=['、', '：'])`,
	`(true, 2)`, `(false, 2, [',', '='], true)`, `(ensure_ascii='yes', sort_keys=true, indent=3)`,
}

// TestTojsonMatchesTheLibrary: the bounded tojson prints what the library's prints, for
// every kind of value and every argument, and its measure is exactly its output's
// length (so the budget charges what is built).
func TestTojsonMatchesTheLibrary(t *testing.T) {
	vals := tojsonValues()
	for name, v := range vals {
		for _, args := range tojsonArgs {
			for _, src := range []string{`{{ v | tojson` + args + ` }}`, `{% filter tojson` + args + ` %}{{ v }}{% endfilter %}`} {
				bound, lib, berr, lerr, b := renderBoth(t, src, map[string]jinja.Value{"v": v}, DefaultMaxOutputBytes)
				require.NoError(t, lerr, "%s %s", name, src)
				require.NoError(t, berr, "%s %s", name, src)
				require.Equal(t, lib, bound, "%s %s", name, src)
				assert.Equal(t, DefaultMaxOutputBytes-len(bound), b.left, "%s %s: charged its output", name, src)
			}
		}
	}
	for _, src := range []string{
		`{{ v | map('tojson') | join('|') }}`,
		`{{ v | map('tojson', indent=2) | join('|') }}`,
		`{{ v | map("tojson", true, '→') | join('|') }}`,
	} {
		for name, v := range vals {
			bound, lib, berr, lerr, _ := renderBoth(t, src, map[string]jinja.Value{"v": v}, DefaultMaxOutputBytes)
			require.Equal(t, lerr == nil, berr == nil, "%s %s: %v / %v", name, src, lerr, berr)
			require.Equal(t, lib, bound, "%s %s", name, src)
		}
	}
	// The library's errors: bad separators, a cycle (reported first).
	for _, src := range []string{
		`{{ v | tojson(separators=[',']) }}`,
		`{{ v | tojson(separators=none) }}`,
		`{{ v | tojson(separators=undefined_name) }}`,
		`{% set d = {} %}{% set _ = d.update({'self': d}) %}{{ d | tojson }}`,
		`{% set d = {} %}{% set _ = d.update({'self': [d]}) %}{{ d | tojson(separators=1) }}`,
		`{% set a = [] %}{% set _ = a.append(a) %}{{ [1, a] | tojson(indent=2) }}`,
	} {
		bound, lib, berr, lerr, _ := renderBoth(t, src, map[string]jinja.Value{"v": vals["all"]}, DefaultMaxOutputBytes)
		require.Equal(t, lerr == nil, berr == nil, "%s: %v / %v", src, lerr, berr)
		if lerr == nil {
			continue
		}
		if i := strings.Index(lerr.Error(), "tojson:"); i >= 0 {
			assert.Contains(t, berr.Error(), lerr.Error()[i:], src)
		}
		assert.Equal(t, lib, bound, src)
	}
}

// TestTojsonSizeIsExact: the measuring pass gives the encoding's exact length, plain
// and ASCII-escaped, so a call is refused exactly when its output would not fit.
func TestTojsonSizeIsExact(t *testing.T) {
	for name, v := range tojsonValues() {
		for _, args := range tojsonArgs {
			for _, ascii := range []bool{false, true} {
				call := strings.TrimSuffix(strings.TrimPrefix(args, "("), ")")
				if ascii && strings.Contains(call, "ensure_ascii") {
					continue
				}
				if ascii {
					call = strings.TrimPrefix(call+", ensure_ascii=true", ", ")
				}
				src := `{{ v | tojson(` + call + `) }}`
				out, _, err, _, _ := renderBoth(t, src, map[string]jinja.Value{"v": v}, DefaultMaxOutputBytes)
				require.NoError(t, err, src)
				if out == "" {
					continue
				}
				_, _, err, _, b := renderBoth(t, src, map[string]jinja.Value{"v": v}, len(out)-1)
				require.ErrorIs(t, err, errTojsonBudget, "%s %s: one byte short", name, src)
				assert.Equal(t, len(out), b.need, "%s %s", name, src)
				_, _, err, _, b = renderBoth(t, src, map[string]jinja.Value{"v": v}, len(out))
				require.NoError(t, err, "%s %s: exactly enough", name, src)
				assert.Zero(t, b.left)
			}
		}
	}
}

// TestTojsonBudgetIsPerRender: the budget is MaxOutputBytes for all of a render's tojson
// calls, printed or not; a render that would exceed it fails with ErrOutputTooLarge
// (through the filter, a filter block or map) whatever chat_template_kwargs say, and the
// next render has the whole budget again.
func TestTojsonBudgetIsPerRender(t *testing.T) {
	body := `{"model": "m", "messages": [{"role": "user", "content": "0123456789"}],
		"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
		"chat_template_kwargs": {"__kvroute_tojson": 1, "__kvroute_map_tojson": 2}}`
	req, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
	require.NoError(t, err)
	one, err := New(`{{ tools | tojson }}`, Tokens{}, Options{})
	require.NoError(t, err)
	out, err := one.Render(req.Chat)
	require.NoError(t, err)
	size := len(out)
	for _, tt := range []struct {
		src      string
		tooLarge bool
	}{
		{`{{ tools | tojson }}`, false},
		{`{% set a = tools | tojson %}{% set b = tools | tojson %}{{ a | length }}`, true},
		{`{% for i in range(2) %}{{ tools | tojson }}{% endfor %}`, true},
		{`{{ tools | map('tojson') | join }}{{ tools | map('tojson') | join }}`, true},
		{`{% filter tojson %}{{ tools[0].type }}{% endfilter %}{{ tools | tojson }}`, true},
		{`{{ tools | tojson | length }}{{ messages[0].content | tojson }}`, true},
		{`{% macro m(x) %}{{ x | tojson }}{% endmacro %}{{ m(tools) }}{{ m(tools) }}`, true},
	} {
		r, err := New(tt.src, Tokens{}, Options{MaxOutputBytes: size + 2})
		require.NoError(t, err, tt.src)
		for range 2 {
			_, err = r.Render(req.Chat)
			if tt.tooLarge {
				require.ErrorIs(t, err, ErrOutputTooLarge, tt.src)
				assert.Contains(t, err.Error(), "tojson would print", tt.src)
			} else {
				require.NoError(t, err, tt.src)
			}
		}
	}
}

// corpusTemplates are the sources of testdata/templates: the ollama templates and the
// syntax corners.
func corpusTemplates(t *testing.T) []string {
	f, err := os.Open(filepath.Join("testdata", "templates", "ollama.json.gz"))
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	var ollama, syntax struct{ Templates []struct{ Template string } }
	require.NoError(t, json.NewDecoder(zr).Decode(&ollama))
	body, err := os.ReadFile(filepath.Join("testdata", "templates", "syntax.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(body, &syntax))
	var out []string
	for _, e := range append(ollama.Templates, syntax.Templates...) {
		out = append(out, e.Template)
	}
	return out
}

// TestBoundTojsonRendersEveryTemplateAsTheLibrary: every corpus template that uses
// tojson, compiled with it bound and with the library's own, renders the committed
// chats alike (prompt, or failure).
func TestBoundTojsonRendersEveryTemplateAsTheLibrary(t *testing.T) {
	bodies := committedChats(t)
	templates, rendered := 0, 0
	for _, src := range corpusTemplates(t) {
		resolved, err := resolveWhitespace(src, true)
		require.NoError(t, err)
		if !strings.Contains(resolved, tojsonFilter) && !strings.Contains(resolved, mapTojsonFilter) {
			continue
		}
		templates++
		r, err := New(src, Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}}, Options{Now: func() time.Time { return llama3Clock }})
		require.NoError(t, err)
		r = withoutDirect(r)
		lib := withoutDirect(r)
		for _, c := range lib.templates {
			c.tmpl, err = compileSource(src, false)
			require.NoError(t, err)
		}
		for name, body := range bodies {
			req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
			require.NoError(t, err, name)
			want, werr := lib.Render(req.Chat)
			got, gerr := r.Render(req.Chat)
			require.Equal(t, werr == nil, gerr == nil, "%s: %v / %v", name, werr, gerr)
			require.Equal(t, want, got, name)
			rendered++
		}
	}
	t.Logf("%d templates use tojson; %d renders alike", templates, rendered)
	require.NotZero(t, rendered)
}

// FuzzTojson: for any JSON value a request can carry and any combination of the
// arguments, the bounded tojson prints what the library's prints, charges exactly its
// output, and refuses a budget one byte short.
func FuzzTojson(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2.5, "x\u00e9\ud83d\ude00"], "b": {}, "c": null, "d": true}`, `[[[[0, [], {}]]]]`,
		`"\u007f\u0000\u001f\"\\\/\b\f\n\r\t"`, `[1e400, -1e400, 1e-400, -0.0, 1e16, 1e-5, 12345678901234567890]`,
		`{"z": 1, "a": {"y": [1], "b": 2}, "é": 3}`} {
		for _, flags := range []uint8{0, 1, 2, 4, 8, 12, 16, 32, 48, 63} {
			f.Add([]byte(s), flags, int8(4))
		}
	}
	const src = `{{ v | tojson(ensure_ascii=ea, indent=ind, separators=seps, sort_keys=sk) }}`
	bound, err := compileSource(src, true)
	require.NoError(f, err)
	lib, err := compileSource(src, false)
	require.NoError(f, err)
	indents := []jinja.Value{jinja.None(), jinja.NewString("\t"), jinja.NewString("→ ")}
	seps := []jinja.Value{jinja.None(), jinja.NewList([]jinja.Value{jinja.NewString(","), jinja.NewString(":")}),
		jinja.NewList([]jinja.Value{jinja.NewString("、"), jinja.NewString("：")}), jinja.NewList([]jinja.Value{jinja.NewString(""), jinja.NewString("")})}
	f.Fuzz(func(t *testing.T, body []byte, flags uint8, indent int8) {
		parsed, err := jsonv.Parse(body, 64)
		if err != nil {
			return
		}
		ind := jinja.NewInt(int64(indent))
		if k := int(flags>>2) & 3; k < len(indents) {
			ind = indents[k]
		}
		data := map[string]jinja.Value{"v": toValue(parsed), "ea": jinja.NewBool(flags&1 != 0), "sk": jinja.NewBool(flags&2 != 0),
			"ind": ind, "seps": seps[int(flags>>4)&3]}
		want, err := execute(lib, data)
		require.NoError(t, err)
		for _, budget := range []int{DefaultMaxOutputBytes, len(want), len(want) - 1} {
			b := &jsonBudget{left: budget}
			b.bind(data)
			got, err := execute(bound, data)
			if budget < len(want) {
				require.ErrorIs(t, err, errTojsonBudget)
				require.Equal(t, len(want), b.need)
				continue
			}
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, budget-len(want), b.left)
		}
	})
}

// longNumber finds a number literal of five digits or more, or a power.
var longNumber = regexp.MustCompile(`[0-9]{5}|\*\*`)

// FuzzBindTojson: any template source, compiled with tojson bound and with the
// library's own, compiles alike and renders a chat with tools, tool calls, documents
// and kwargs alike, unless the bounded tojson refused its budget.
func FuzzBindTojson(f *testing.F) {
	for _, s := range []string{`{{ tools | tojson }}`, `{{- tools|tojson(indent=4) -}}`, `{% filter tojson %}{{ messages }}{% endfilter %}`,
		`{{ tools | map('tojson') | join('\n') }}`, `{{ tools | map("tojson", indent=2, sort_keys=true) | list }}`,
		`{{ messages | map('tojson', attribute='role') | list }}`, `{% raw %}{{ x | tojson }}{% endraw %}{{ 'a | tojson' }}`,
		`{% set tojson = 1 %}{{ tojson }}{{ x.tojson }}{{ documents | tojson(ensure_ascii=true) }}`,
		`{% macro m(x) %}{{ x | tojson(separators=[',', ':']) }}{% endmacro %}{% for m2 in messages %}{{ m(m2) }}{% endfor %}`,
		`{%- for m in messages %}{% for c in m.tool_calls | default([]) %}{{ c.function.arguments | tojson | safe }}{% endfor %}{% endfor %}`,
		`{{ x | tojson.y }}{{ (tools | tojson)[0:10] }}{{ tools | tojson | length }}`} {
		f.Add(s)
	}
	body := `{"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "é\u0000"},
		{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, 2.5]}"}}]},
		{"role": "tool", "tool_call_id": "c", "content": "r"}],
		"tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}}],
		"documents": [{"title": "t", "text": "x"}], "chat_template_kwargs": {"flag": [1, {"k": "v"}]}}`
	req, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
	require.NoError(f, err)
	opts := Options{Now: func() time.Time { return llama3Clock }, MaxOutputBytes: 1 << 16}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 4096 || longNumber.MatchString(src) {
			return // the library's own tojson and repetitions allocate what they are asked
		}
		r, err := New(src, Tokens{}, opts)
		_, libErr := compileSource(src, false)
		require.Equal(t, err == nil, libErr == nil, "%v / %v", err, libErr)
		if err != nil {
			return
		}
		r = withoutDirect(r)
		lib := withoutDirect(r)
		for _, c := range lib.templates {
			c.tmpl, _ = compileSource(src, false)
		}
		got, gerr := r.Render(req.Chat)
		if errors.Is(gerr, ErrOutputTooLarge) {
			return
		}
		want, werr := lib.Render(req.Chat)
		require.Equal(t, werr == nil, gerr == nil, "%v / %v", werr, gerr)
		require.Equal(t, want, got)
	})
}
