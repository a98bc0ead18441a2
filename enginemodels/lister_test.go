package enginemodels

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/internal/h2ctest"
	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/internal/poll"
)

// engine serves a model list that a test may change, and remembers the last
// Authorization header it got.
type engine struct {
	srv    *httptest.Server
	page   atomic.Value // string
	status atomic.Int32
	auth   atomic.Value // string
}

func newEngine(t *testing.T, page string) *engine {
	e := &engine{}
	e.page.Store(page)
	e.status.Store(http.StatusOK)
	e.auth.Store("")
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.auth.Store(r.Header.Get("Authorization"))
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(e.status.Load()))
		_, _ = w.Write([]byte(e.page.Load().(string)))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) target(name string) poll.Target {
	return poll.Target{Name: name, Address: strings.TrimPrefix(e.srv.URL, "http://")}
}

const (
	sqlOnly  = `{"data":[{"id":"m"},{"id":"sql","parent":"m"}]}`
	chatOnly = `{"data":[{"id":"m"},{"id":"chat","parent":"m"}]}`
)

func newLister(t *testing.T, cfg Config, targets []poll.Target) (*Lister, *fakeclock.Clock, *logbuf.Buffer, *prometheus.Registry) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1e9, 0))
	logs := &logbuf.Buffer{}
	reg := prometheus.NewRegistry()
	l, err := New(cfg, targets, Deps{Now: clock.Now, Log: slog.New(slog.NewTextHandler(logs, nil)), Registerer: reg})
	require.NoError(t, err)
	return l, clock, logs, reg
}

func TestListerKnowsWhichWorkerServesWhichAdapter(t *testing.T) {
	w0, w1 := newEngine(t, sqlOnly), newEngine(t, chatOnly)
	l, _, _, reg := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")})

	serves, known := l.ServesAdapter("w0", "sql")
	assert.False(t, known, "nothing is known before the first read")
	assert.False(t, serves)

	l.ReadAll(context.Background())
	tests := []struct {
		worker, adapter string
		serves, known   bool
	}{
		{"w0", "sql", true, true},
		{"w0", "chat", false, true},
		{"w1", "chat", true, true},
		{"w1", "sql", false, true},
		{"w2", "sql", false, false},
	}
	for _, tt := range tests {
		serves, known := l.ServesAdapter(tt.worker, tt.adapter)
		assert.Equal(t, tt.serves, serves, "%s serves %s", tt.worker, tt.adapter)
		assert.Equal(t, tt.known, known, "%s known", tt.worker)
	}
	for adapter, want := range map[string]string{"sql": "m", "chat": "m", "m": "", "other": ""} {
		base, ok := l.BaseOf(adapter)
		assert.Equal(t, want, base, adapter)
		assert.Equal(t, want != "", ok, adapter)
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(l.scrapes.WithLabelValues(outcomeOK)))
	assert.Equal(t, 2.0, gauge(t, reg, "kvroute_engine_models_adapters"), "sql and chat")
	assert.Equal(t, 2.0, gauge(t, reg, "kvroute_engine_models_known_lists"))
}

// The base models each engine lists (cards without a parent, and the parents of its
// adapters) are what a worker configured without models serves; an adapter's name is
// not one of them.
func TestListerKnowsWhichWorkerServesWhichModel(t *testing.T) {
	w0 := newEngine(t, `{"data":[{"id":"m"},{"id":"m-alias","parent":null},{"id":"sql","parent":"m"},{"id":"chat","parent":"m-hub/path"}]}`)
	w1 := newEngine(t, `{"data":[{"id":"other"}]}`)
	l, _, _, _ := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")})
	_, known := l.ServesModel("w0", "m")
	assert.False(t, known, "nothing is known before the first read")

	l.ReadAll(context.Background())
	tests := []struct {
		worker, model string
		serves, known bool
	}{
		{"w0", "m", true, true},
		{"w0", "m-alias", true, true},
		{"w0", "sql", false, true},
		{"w0", "m-hub/path", true, true}, // an adapter's parent
		{"w0", "other", false, true},
		{"w1", "other", true, true},
		{"w1", "m", false, true},
		{"w2", "m", false, false},
	}
	for _, tt := range tests {
		serves, known := l.ServesModel(tt.worker, tt.model)
		assert.Equal(t, tt.serves, serves, "%s serves %s", tt.worker, tt.model)
		assert.Equal(t, tt.known, known, "%s known", tt.worker)
	}
	models, known := l.Models("w0")
	assert.True(t, known)
	assert.Equal(t, []string{"m", "m-alias", "m-hub/path"}, models)
}

// TestListerKnowsEachEnginesContext: each worker's context length is its own engine's
// card's (two pods of one model may be started with different --max-model-len), and
// it is unknown until read and once the list is stale.
func TestListerKnowsEachEnginesContext(t *testing.T) {
	w0 := newEngine(t, `{"data":[{"id":"m","max_model_len":32768},{"id":"sql","parent":"m"}]}`)
	w1 := newEngine(t, `{"data":[{"id":"m","max_model_len":131072},{"id":"n"}]}`)
	cfg := DefaultConfig()
	l, clock, _, _ := newLister(t, cfg, []poll.Target{w0.target("w0"), w1.target("w1")})
	_, known := l.ContextLength("w0", "m")
	assert.False(t, known, "nothing is known before the first read")

	l.ReadAll(context.Background())
	tests := []struct {
		worker, model string
		want          int
		known         bool
	}{
		{"w0", "m", 32768, true},
		{"w1", "m", 131072, true},
		{"w0", "sql", 0, false}, // vLLM gives adapters' cards none: ask for the base model
		{"w1", "n", 0, false},
		{"w2", "m", 0, false},
	}
	for _, tt := range tests {
		n, known := l.ContextLength(tt.worker, tt.model)
		assert.Equal(t, tt.want, n, "%s %s", tt.worker, tt.model)
		assert.Equal(t, tt.known, known, "%s %s known", tt.worker, tt.model)
	}
	contexts, known := l.ContextLengths("w1")
	assert.True(t, known)
	assert.Equal(t, map[string]int{"m": 131072}, contexts)
	clock.Advance(staleAfter*cfg.Interval + cfg.Timeout + time.Millisecond)
	_, known = l.ContextLength("w0", "m")
	assert.False(t, known, "a stale list gives no context")
}

// TestListerForgetsAStaleList: a worker whose list cannot be read again is, after three
// intervals, taken to serve every adapter (unknown), not frozen at its last list; a
// page that is not a list an engine sends counts as refused and is warned of once.
func TestListerForgetsAStaleList(t *testing.T) {
	w0 := newEngine(t, sqlOnly)
	cfg := DefaultConfig()
	l, clock, logs, _ := newLister(t, cfg, []poll.Target{w0.target("w0")})
	l.ReadAll(context.Background())
	_, known := l.ServesAdapter("w0", "chat")
	require.True(t, known)

	w0.page.Store(`{"data":[{"id":"a","parent":"a"}]}`)
	for range 3 {
		clock.Advance(cfg.Interval)
		l.ReadAll(context.Background())
	}
	serves, known := l.ServesAdapter("w0", "sql")
	assert.True(t, known && serves, "within 3 intervals and a timeout the last list stands")
	clock.Advance(cfg.Timeout + time.Millisecond)
	l.ReadAll(context.Background())
	_, known = l.ServesAdapter("w0", "sql")
	assert.False(t, known, "a stale list is forgotten")
	_, ok := l.BaseOf("sql")
	assert.False(t, ok, "a stale list names no adapter")
	assert.Equal(t, 4.0, testutil.ToFloat64(l.scrapes.WithLabelValues(outcomeRefused)))
	assert.Equal(t, 1, strings.Count(logs.String(), "engine model list unreadable"), logs.String())

	w0.page.Store(chatOnly)
	l.ReadAll(context.Background())
	serves, known = l.ServesAdapter("w0", "chat")
	assert.True(t, known && serves, "a readable list again is taken at once")
}

func TestListerReadFailures(t *testing.T) {
	tests := []struct {
		name        string
		status      int
		contentType string
		page        string
	}{
		{"not 200", http.StatusUnauthorized, "application/json", sqlOnly},
		{"not JSON content", http.StatusOK, "text/html", sqlOnly},
		{"not JSON", http.StatusOK, "application/json", "<html>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.page))
			}))
			defer srv.Close()
			l, _, logs, _ := newLister(t, DefaultConfig(), []poll.Target{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}})
			l.ReadAll(context.Background())
			_, known := l.ServesAdapter("w0", "sql")
			assert.False(t, known)
			assert.Equal(t, 1.0, testutil.ToFloat64(l.scrapes.WithLabelValues(outcomeFailed)))
			assert.Contains(t, logs.String(), "engine model list unreadable")
		})
	}
}

// TestListerLeavesOutAnAdapterTwoListsGiveDifferentBases: two engines that disagree on
// an adapter's base model route it by neither's word (a warning says so); each still
// serves the adapter for the candidates' filter.
func TestListerLeavesOutAnAdapterTwoListsGiveDifferentBases(t *testing.T) {
	w0 := newEngine(t, `{"data":[{"id":"a","parent":"m"}]}`)
	w1 := newEngine(t, `{"data":[{"id":"a","parent":"n"}]}`)
	l, _, logs, reg := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")})
	l.ReadAll(context.Background())
	l.ReadAll(context.Background())
	_, ok := l.BaseOf("a")
	assert.False(t, ok)
	assert.Equal(t, 0.0, gauge(t, reg, "kvroute_engine_models_adapters"), "an adapter the lists disagree on is not counted")
	assert.Equal(t, 1, strings.Count(logs.String(), "disagree"), logs.String())
	serves, known := l.ServesAdapter("w1", "a")
	assert.True(t, serves && known)
}

func TestListerForgetsRemovedWorkers(t *testing.T) {
	w0, w1 := newEngine(t, sqlOnly), newEngine(t, chatOnly)
	l, _, _, _ := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")})
	l.ReadAll(context.Background())
	l.SetWorkers([]poll.Target{w1.target("w1")})
	_, known := l.ServesAdapter("w0", "sql")
	assert.False(t, known)
	_, ok := l.BaseOf("sql")
	assert.False(t, ok, "only w0 named sql")
	_, ok = l.BaseOf("chat")
	assert.True(t, ok)
}

// A worker that joins (a pod discovery found, a reload) has its list read at once, not
// at the next interval: until then it would take requests for any model, which its
// engine answers with 404 when it serves another.
func TestListerReadsAJoiningWorkersListAtOnce(t *testing.T) {
	w0, w1 := newEngine(t, sqlOnly), newEngine(t, chatOnly)
	cfg := DefaultConfig()
	cfg.Interval = time.Hour
	l, _, _, _ := newLister(t, cfg, []poll.Target{w0.target("w0")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	known := func(worker string) func() bool {
		return func() bool { _, ok := l.Models(worker); return ok }
	}
	// The deadlines only bound a broken lister: the engines answer at once.
	require.Eventually(t, known("w0"), time.Minute, 5*time.Millisecond, "read when it starts")

	l.SetWorkers([]poll.Target{w0.target("w0"), w1.target("w1")})
	require.Eventually(t, known("w1"), time.Minute, 5*time.Millisecond, "read when it joins")
	serves, _ := l.ServesAdapter("w1", "chat")
	assert.True(t, serves)
}

// TestListerSendsTheAPIKey: vLLM's --api-key guards /v1/models; the key file is read
// each round, so a rotated Secret is sent from the next read on.
func TestListerSendsTheAPIKey(t *testing.T) {
	w0 := newEngine(t, sqlOnly)
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("first\n"), 0o600))
	cfg := DefaultConfig()
	cfg.APIKeyFile = keyFile
	l, _, _, _ := newLister(t, cfg, []poll.Target{w0.target("w0")})
	l.ReadAll(context.Background())
	assert.Equal(t, "Bearer first", w0.auth.Load())
	require.NoError(t, os.WriteFile(keyFile, []byte("second"), 0o600))
	l.ReadAll(context.Background())
	assert.Equal(t, "Bearer second", w0.auth.Load())
}

// The key from a variable is trimmed as the render key's is (one reader, secret.Read):
// a Secret mounted as an environment variable often ends in a newline.
func TestListerSendsTheAPIKeyFromAVariableTrimmed(t *testing.T) {
	w0 := newEngine(t, sqlOnly)
	t.Setenv("KVROUTE_TEST_MODELS_KEY", "from-env\n")
	cfg := DefaultConfig()
	cfg.APIKeyEnv = "KVROUTE_TEST_MODELS_KEY"
	require.NoError(t, cfg.Validate())
	l, _, _, _ := newLister(t, cfg, []poll.Target{w0.target("w0")})
	l.ReadAll(context.Background())
	assert.Equal(t, "Bearer from-env", w0.auth.Load())
}

func TestConfigValidate(t *testing.T) {
	t.Setenv("KVROUTE_TEST_EMPTY", "")
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"default", func(*Config) {}, ""},
		{"off", func(c *Config) { c.Interval = 0 }, ""},
		{"off with a key not mounted", func(c *Config) { c.Interval, c.APIKeyFile = 0, "/nonexistent/key" }, ""},
		{"relative path", func(c *Config) { c.Path = "v1/models" }, "engine_models.path"},
		{"negative interval", func(c *Config) { c.Interval = -time.Second }, "engine_models.interval"},
		{"no timeout", func(c *Config) { c.Timeout = 0 }, "engine_models.timeout"},
		{"two keys", func(c *Config) { c.APIKeyFile, c.APIKeyEnv = "/k", "K" }, "engine_models.api_key_file: only one of"},
		{"two keys while off", func(c *Config) { c.Interval, c.APIKeyFile, c.APIKeyEnv = 0, "/k", "K" }, "engine_models.api_key_file: only one of"},
		{"missing key file", func(c *Config) { c.APIKeyFile = "/nonexistent/key" }, "engine_models.api_key_file"},
		{"empty key variable", func(c *Config) { c.APIKeyEnv = "KVROUTE_TEST_EMPTY" }, "engine_models.api_key_env: the environment variable KVROUTE_TEST_EMPTY is not set or empty"},
		{"a key variable that is no name", func(c *Config) { c.APIKeyEnv = "MY KEY" }, "engine_models.api_key_env: want an environment variable name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.change(&cfg)
			err := cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestListerTakesNoAdapterForAServedModel: a name one engine serves as a base model is
// that model, even where another engine lists an adapter of that name: a worker serving
// any model must not lose it to the adapter (helper-32's review).
func TestListerTakesNoAdapterForAServedModel(t *testing.T) {
	w0 := newEngine(t, `{"data":[{"id":"llama","parent":null}]}`)
	w1 := newEngine(t, `{"data":[{"id":"qwen"},{"id":"llama","parent":"qwen"},{"id":"sql","parent":"qwen"}]}`)
	l, _, _, _ := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")})
	l.ReadAll(context.Background())
	_, ok := l.BaseOf("llama")
	assert.False(t, ok)
	base, ok := l.BaseOf("sql")
	assert.True(t, ok)
	assert.Equal(t, "qwen", base)
}

// TestListerForgetsAWorkerThatMoved: a pod restarted under its name with a new address
// has not loaded what the old one had.
func TestListerForgetsAWorkerThatMoved(t *testing.T) {
	w0, moved := newEngine(t, sqlOnly), newEngine(t, chatOnly)
	l, _, _, reg := newLister(t, DefaultConfig(), []poll.Target{w0.target("w0")})
	l.ReadAll(context.Background())
	assert.Equal(t, 1.0, gauge(t, reg, "kvroute_engine_models_known_lists"))
	l.SetWorkers([]poll.Target{moved.target("w0")})
	_, known := l.ServesAdapter("w0", "sql")
	assert.False(t, known, "the old address's list is gone")
	assert.Equal(t, 0.0, gauge(t, reg, "kvroute_engine_models_known_lists"))
	l.ReadAll(context.Background())
	serves, known := l.ServesAdapter("w0", "chat")
	assert.True(t, serves && known)
}

// TestListerRefusesWhatNoEngineSends: a page over 4 MiB is refused, and a content type
// reaches the log quoted and cut, whatever its length.
func TestListerRefusesWhatNoEngineSends(t *testing.T) {
	for _, tt := range []struct {
		name, contentType, page, wantLog string
		wantOutcome                      string
	}{
		{"a page over 4 MiB", "application/json", `{"data":[` + strings.Repeat(" ", maxBody) + `]}`, "more than 4194304 bytes", outcomeRefused},
		{"a long content type", strings.Repeat("x", 100000), sqlOnly, `content type \"xxxx`, outcomeFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				_, _ = w.Write([]byte(tt.page))
			}))
			defer srv.Close()
			l, _, logs, _ := newLister(t, DefaultConfig(), []poll.Target{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}})
			l.ReadAll(context.Background())
			assert.Equal(t, 1.0, testutil.ToFloat64(l.scrapes.WithLabelValues(tt.wantOutcome)))
			assert.Contains(t, logs.String(), tt.wantLog)
			assert.Less(t, len(logs.String()), 1000, "the log line is bounded")
		})
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// An h2c pool's engines may speak HTTP/2 over cleartext alone: a worker said to speak
// h2c has its list read so, the others over HTTP/1.1.
func TestListsAreReadInEachWorkersProtocol(t *testing.T) {
	tests := []struct {
		name      string
		h2cOnly   bool // the engine refuses HTTP/1.1
		workerH2C bool
		wantKnown bool
		wantProto string
	}{
		{"an HTTP/1.1 worker's list is read over HTTP/1.1", false, false, true, "HTTP/1.1"},
		{"an h2c worker's list is read over h2c", true, true, true, "HTTP/2.0"},
		{"an h2c-only engine refuses HTTP/1.1: the worker must say h2c", true, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var proto atomic.Value
			proto.Store("")
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/v1/models" { // an HTTP/1.1 server's "PRI *", h2c's preface
					return
				}
				proto.Store(r.Proto)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(sqlOnly))
			})
			srv := h2ctest.NewEngine(t, h, tt.h2cOnly)
			l, _, _, _ := newLister(t, DefaultConfig(), []poll.Target{{Name: "w0", Address: srv.Listener.Addr().String(), H2C: tt.workerH2C}})
			l.ReadAll(context.Background())
			serves, known := l.ServesModel("w0", "m")
			assert.Equal(t, tt.wantKnown, known)
			assert.Equal(t, tt.wantKnown, serves)
			assert.Equal(t, tt.wantProto, proto.Load())
		})
	}
}

// TestAReadThatPanicsFailsThatWorkersReadAlone: a panic while one worker's list is
// read (a bug its answer reached) is recovered and counted, and is a failed read of
// that list: its last list stands until it ages out, the other worker's list of the
// round is read, and the next round reads both again.
func TestAReadThatPanicsFailsThatWorkersReadAlone(t *testing.T) {
	w0, w1 := newEngine(t, sqlOnly), newEngine(t, sqlOnly)
	transport := &backgroundtest.PanicOnce{} // no Host yet: it panics at nothing
	clock := fakeclock.New(time.Unix(1e9, 0))
	reg := prometheus.NewRegistry()
	l, err := New(DefaultConfig(), []poll.Target{w0.target("w0"), w1.target("w1")}, Deps{Now: clock.Now, Registerer: reg,
		Panics: background.NewMetrics(reg), Client: &http.Client{Transport: transport}})
	require.NoError(t, err)
	ctx := context.Background()
	l.ReadAll(ctx)

	transport.Host = w0.target("w0").Address // before the round's reads start
	w0.page.Store(chatOnly)
	w1.page.Store(chatOnly)
	clock.Advance(time.Second)
	l.ReadAll(ctx)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopModels))
	assert.Equal(t, 1.0, testutil.ToFloat64(l.scrapes.WithLabelValues(outcomeFailed)), "the panicking read failed")
	serves, known := l.ServesAdapter("w0", "sql")
	assert.True(t, known && serves, "its last list stands while fresh")
	serves, _ = l.ServesAdapter("w1", "chat")
	assert.True(t, serves, "the other worker's list was read")

	clock.Advance(time.Second)
	l.ReadAll(ctx)
	serves, _ = l.ServesAdapter("w0", "chat")
	assert.True(t, serves, "the next round read it")
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopModels), "one panic, counted once")
}
