package models_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestNoConfigUsesTheEmbeddedQwen3: with no tokenizers section every model gets the
// embedded Qwen3 tokenizer and template.
func TestNoConfigUsesTheEmbeddedQwen3(t *testing.T) {
	s, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	assert.Equal(t, "builtin:qwen3 (default)", s.Source("any"))
	assert.False(t, s.Approx("any"))
	_, ids := encode(t, s, "any", tokenize.Prompt{Text: "Hello world"})
	assert.Equal(t, []uint32{9707, 1879}, ids, "Qwen3's ids (no BOS)")
	text, ids := encode(t, s, "any", tokenize.Prompt{Chat: tokenize.TextChat("user", "Hello world")})
	assert.Equal(t, "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n", text)
	assert.Equal(t, []uint32{151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198}, ids)
}

// TestAModelWithoutAnEntryWarnsOnce: the default's warning is logged once per model, and
// the set of models warned about is bounded (names come from requests).
// TestOnlyAModelsOwnTokenizerGivesExactCounts: a prompt's ids count as the engine's
// (Encoding.Approximate unset) only from the model's own entry or a default the config
// names for every model; the embedded default, guessed for a model without an entry,
// and the approx tokenizer mark theirs approximate (the router then never takes their
// count for the engine's, e.g. against its context).
func TestOnlyAModelsOwnTokenizerGivesExactCounts(t *testing.T) {
	tests := []struct {
		name            string
		cfg             models.Config
		model           string
		wantApproximate bool
	}{
		{"its own entry", models.Config{"qwen": {Builtin: models.DefaultBuiltin}}, "qwen", false},
		{"no entry: the embedded default, guessed", models.Config{"qwen": {Builtin: models.DefaultBuiltin}}, "other", true},
		{"no config at all", nil, "other", true},
		{"no entry, a default entry named for every model", models.Config{models.DefaultKey: {Builtin: models.DefaultBuiltin}}, "other", false},
		{"an approx entry", models.Config{"m": {Approx: true}}, "m", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := models.Load(tt.cfg, models.Deps{})
			require.NoError(t, err)
			enc, err := s.Model(tt.model).EncodePrompt(context.Background(), tokenize.Prompt{Text: "Hello there, world."})
			require.NoError(t, err)
			require.NotEmpty(t, enc.IDs)
			assert.Equal(t, tt.wantApproximate, enc.Approximate)
		})
	}
}

func TestAModelWithoutAnEntryWarnsOnce(t *testing.T) {
	dir := writeDir(t, t.TempDir(), tinyConfig, "")
	var logs bytes.Buffer
	s, err := models.Load(models.Config{"default": {Path: dir}, "known": {Approx: true}},
		models.Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	assert.Equal(t, "approx", s.Source("known"))
	assert.True(t, s.Approx("known"))
	assert.False(t, s.Approx("other"))
	for range 3 {
		encode(t, s, "other", tokenize.Prompt{Text: "ab"})
		encode(t, s, "known", tokenize.Prompt{Text: "ab"})
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "no entry for this model"), logs.String())
	assert.Contains(t, logs.String(), "model=other")

	logs.Reset()
	for i := range 3000 {
		s.Model(fmt.Sprint("m", i))
	}
	lines := strings.Count(logs.String(), "\n")
	assert.Equal(t, 1024, lines, "1023 new models warned about, then one line saying no more will be")
	assert.Contains(t, logs.String(), "no further warnings")
	logs.Reset()
	s.Model("one more")
	assert.Empty(t, logs.String())
}

// TestOneFileForTwoModelsIsLoadedOnce: models sharing a tokenizer share it, and its memo
// counters are exported once.
func TestOneFileForTwoModelsIsLoadedOnce(t *testing.T) {
	dir := writeDir(t, t.TempDir(), tinyConfig, "")
	s, err := models.Load(models.Config{"a": {Path: dir}, "b": {Path: filepath.Join(dir, "tokenizer.json")}, "default": {Approx: true}}, models.Deps{})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	models.NewMetrics(reg, s)
	models.NewMetrics(nil, s) // a nil registerer registers nothing
	chat := tokenize.Prompt{Chat: tokenize.TextChat("user", "ab ab ab", "assistant", "ab")}
	encode(t, s, "a", chat)
	encode(t, s, "b", chat)
	n, err := testutil.GatherAndCount(reg, "kvroute_tokenize_memo_hits_total")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one tokenizer (approx has no memo)")
	file := filepath.Join(dir, "tokenizer.json")
	hits := testutil.ToFloat64(gathered(t, reg, "kvroute_tokenize_memo_hits_total", file))
	misses := testutil.ToFloat64(gathered(t, reg, "kvroute_tokenize_memo_misses_total", file))
	assert.Positive(t, misses)
	assert.Equal(t, misses, hits, "the second model's identical chat came from the first's memo")
	assert.Positive(t, testutil.ToFloat64(gathered(t, reg, "kvroute_tokenize_memo_bytes", file)))
}

// gathered returns the named series of reg with tokenizer=label as a collector.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(m.GetCounter().GetValue() + m.GetGauge().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no %s{tokenizer=%q}", name, label)
	return nil
}

// renderWorker serves a mock worker (the render endpoints kvroute's engine mode asks)
// tokenizing with the tiny tokenizer.
func renderWorker(t *testing.T, delay time.Duration) string {
	t.Helper()
	local, err := models.Load(models.Config{"default": {Path: writeDir(t, t.TempDir(), tinyConfig, "")}}, models.Deps{})
	require.NoError(t, err)
	w, err := mockworker.New(mockworker.Config{Name: "r", Engine: sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 1024},
		Speed: 50, Seed: 1, Tokenizers: local, RenderDelay: delay})
	require.NoError(t, err)
	srv := httptest.NewServer(w.Handler())
	t.Cleanup(func() { srv.Close(); w.Close() })
	return srv.URL
}

// TestEngineModeAsksTheRenderEndpoint: a model in engine mode gets the ids the engine's
// render endpoints compute (here a mock worker's, through HTTP), for chats and
// completions; a failing engine is an ErrEngine, which the router routes by load.
func TestEngineModeAsksTheRenderEndpoint(t *testing.T) {
	url := renderWorker(t, 0)
	slow := renderWorker(t, time.Minute)
	down := httptest.NewServer(nil)
	down.Close()
	reg := prometheus.NewRegistry()
	s, err := models.Load(models.Config{
		"m":    {Engine: &engine.Config{URL: url}},
		"slow": {Engine: &engine.Config{URL: slow, Timeout: 50 * time.Millisecond}},
		"down": {Engine: &engine.Config{URL: down.URL}},
		// A default entry (approx) keeps the test off the embedded tokenizer's load.
		"default": {Approx: true},
	}, models.Deps{EngineMetrics: engine.NewMetrics(reg)})
	require.NoError(t, err)
	assert.Equal(t, "engine "+url, s.Source("m"))

	chatBody := []byte(`{"model":"m","messages":[{"role":"user","content":"ab"},{"role":"assistant","content":"a b"}]}`)
	text, ids := encode(t, s, "m", tokenize.Prompt{Chat: tokenize.TextChat("user", "ab", "assistant", "a b"), Body: chatBody})
	assert.Equal(t, "", text, "the render endpoints return ids only")
	assert.Equal(t, []uint32{4, 2, 3, 0, 3, 1, 3}, ids, "the worker's template and tokenizer")
	_, ids = encode(t, s, "m", tokenize.Prompt{Text: "ab b", Body: []byte(`{"model":"m","prompt":"ab b"}`)})
	assert.Equal(t, []uint32{4, 2, 3, 1}, ids)
	assert.Equal(t, 2.0, testutil.ToFloat64(metricVec(t, reg, "m", engine.OutcomeOK)))

	for model, outcome := range map[string]string{"slow": engine.OutcomeTimeout, "down": engine.OutcomeUnreachable} {
		_, err := s.Model(model).EncodePrompt(context.Background(), tokenize.Prompt{Chat: tokenize.TextChat("user", "ab"), Body: chatBody})
		require.ErrorIs(t, err, tokenize.ErrEngine, model)
		assert.Equal(t, 1.0, testutil.ToFloat64(metricVec(t, reg, model, outcome)), model)
	}
}

// metricVec returns kvroute_engine_renders_total{model,outcome}.
func metricVec(t *testing.T, reg *prometheus.Registry, model, outcome string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	for _, f := range families {
		if f.GetName() != "kvroute_engine_renders_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model"] == model && labels["outcome"] == outcome {
				g.Set(m.GetCounter().GetValue())
			}
		}
	}
	return g
}

// TestChatRendersAreCountedByRenderer: the embedded default's chats are counted by the
// way they were rendered, Qwen3's direct renderer for a plain chat and the Jinja library
// for one with tools, under kvroute_tokenize_chat_renders_total.
func TestChatRendersAreCountedByRenderer(t *testing.T) {
	s, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	models.NewMetrics(reg, s)
	plain := tokenize.TextChat("system", "Be brief.", "user", "Hello", "assistant", "Hi!", "user", "How are you?")
	encode(t, s, "any-model", tokenize.Prompt{Chat: plain})
	encode(t, s, "any-model", tokenize.Prompt{Chat: plain})
	withTools := tokenize.TextChat("user", "What is the weather?")
	withTools.Tools = []jsonv.Value{mustParseJSON(t, `{"type":"function","function":{"name":"weather","parameters":{}}}`)}
	encode(t, s, "any-model", tokenize.Prompt{Chat: withTools})

	counts := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "kvroute_tokenize_chat_renders_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, "builtin:"+models.DefaultBuiltin, labels["tokenizer"])
			counts[labels["renderer"]] = m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, map[string]float64{"direct": 2, "jinja": 1}, counts)
}

func mustParseJSON(t *testing.T, s string) jsonv.Value {
	t.Helper()
	v, err := jsonv.Parse([]byte(s), 16)
	require.NoError(t, err)
	return v
}
