package models

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// memoSeries is the embedded default's memo hits and misses on reg.
func memoSeries(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == "builtin:"+DefaultBuiltin {
				out = append(out, f.GetName())
			}
		}
	}
	return strings.Join(out, " ")
}

// TestDeferredDefaultLoadsAtTheFirstModelWithoutAnEntry: with DeferDefault, Load leaves
// the embedded default unloaded; the models with an entry never load it; the first
// encodes of a model without one, concurrent, load it once and all get its ids.
func TestDeferredDefaultLoadsAtTheFirstModelWithoutAnEntry(t *testing.T) {
	var logs bytes.Buffer // slog's handler serialises its writes; read after the encodes
	s, err := Load(Config{"known": {Approx: true}}, Deps{DeferDefault: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	require.NotNil(t, s.deferred)
	reg := prometheus.NewRegistry()
	NewMetrics(reg, s)
	assert.Equal(t, "kvroute_tokenize_memo_bytes kvroute_tokenize_memo_entries kvroute_tokenize_memo_hits_total kvroute_tokenize_memo_misses_total",
		memoSeries(t, reg), "the default's series are there, at zero, before it loads")

	_, err = s.Model("known").EncodePrompt(context.Background(), tokenize.Prompt{Text: "Hello world"})
	require.NoError(t, err)
	assert.Equal(t, "builtin:qwen3 (default)", s.Source("other"))
	assert.False(t, s.Approx("other"))
	assert.Nil(t, s.deferred.loaded.Load(), "a model with an entry does not load the default")
	assert.NotContains(t, logs.String(), "loaded the default tokenizer")

	var wg sync.WaitGroup
	ids := make([][]uint32, 8)
	errs := make([]error, len(ids))
	for i := range ids {
		wg.Go(func() {
			var enc tokenize.Encoding
			enc, errs[i] = s.Model("other").EncodePrompt(context.Background(), tokenize.Prompt{Text: "Hello world"})
			ids[i] = enc.IDs
		})
	}
	wg.Wait()
	for i := range ids {
		require.NoError(t, errs[i])
		assert.Equal(t, []uint32{9707, 1879}, ids[i], "Qwen3's ids, as when loaded by Load")
	}
	assert.NotNil(t, s.deferred.loaded.Load())
	assert.Equal(t, 1, strings.Count(logs.String(), "loaded the default tokenizer"), logs.String())
	assert.Equal(t, 1, strings.Count(logs.String(), "no entry for this model"), logs.String())
	assert.Positive(t, testutil.ToFloat64(counter(t, reg, "kvroute_tokenize_memo_misses_total")), "the loaded default's memo is read")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// counter returns the embedded default's series of the named family as a collector.
func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "builtin:"+DefaultBuiltin {
					g.Set(m.GetCounter().GetValue())
				}
			}
		}
	}
	return g
}

// TestDeferredDefaultTable: what Load does with the embedded default, per config.
func TestDeferredDefaultTable(t *testing.T) {
	tests := []struct {
		name         string
		cfg          Config
		deferDefault bool
		deferred     bool
	}{
		{"not asked: loaded by Load", Config{"m": {Approx: true}}, false, false},
		{"asked: deferred", Config{"m": {Approx: true}}, true, true},
		{"an entry loaded the same builtin: shared at once", Config{"m": {Builtin: DefaultBuiltin}}, true, false},
		{"a default entry: loaded by Load", Config{DefaultKey: {Approx: true}}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Load(tt.cfg, Deps{DeferDefault: tt.deferDefault})
			require.NoError(t, err)
			assert.Equal(t, tt.deferred, s.deferred != nil)
			if !tt.deferred {
				_, isDeferred := s.def.encoder.(*deferredModel)
				assert.False(t, isDeferred)
			}
		})
	}
}

// TestDeferredDefaultLoadErrorRoutesByLoad: a deferred default that fails to load is
// loaded once; every request of a model without an entry then gets its error, which the
// router's prompter counts as a fallback ("error") and routes by load, and it is logged.
func TestDeferredDefaultLoadErrorRoutesByLoad(t *testing.T) {
	var logs bytes.Buffer // slog's handler serialises its writes; read after the encodes
	s, err := Load(Config{"known": {Approx: true}}, Deps{DeferDefault: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	var loads atomic.Int32
	s.deferred.load = func() (*model, *local, error) { // as the real one fails
		loads.Add(1)
		return nil, nil, errors.New("tokenizers.default (the embedded default): builtin: broken")
	}
	prompter := router.Prompter{BlockSize: 4, Tokenizers: s}
	var wg sync.WaitGroup
	prompts := make([]router.Prompt, 4)
	for i := range prompts {
		wg.Go(func() {
			var err error
			prompts[i], err = prompter.Prompt(context.Background(), &router.Request{Model: "other", Chat: tokenize.TextChat("user", "Hello world")})
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	for _, p := range prompts {
		assert.Equal(t, router.FallbackError, p.Fallback)
		assert.ErrorContains(t, p.FallbackErr, "tokenizers.default (the embedded default)")
		assert.Empty(t, p.Tokens)
	}
	assert.Equal(t, int32(1), loads.Load(), "one load for every request")
	assert.Equal(t, 1, strings.Count(logs.String(), "the default tokenizer does not load"), logs.String())
	p, err := prompter.Prompt(context.Background(), &router.Request{Model: "known", Chat: tokenize.TextChat("user", "Hello world")})
	require.NoError(t, err)
	assert.Empty(t, p.Fallback, "models with an entry are untouched")
	assert.Nil(t, s.deferred.loaded.Load())
}
