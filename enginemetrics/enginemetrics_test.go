package enginemetrics

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/internal/h2ctest"
)

// vllmMetrics is the shape of a vLLM /metrics page (trimmed).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} %s
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} %s
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1234.0
`

func page(waiting, usage string) string { return fmt.Sprintf(vllmMetrics, waiting, usage) }

func TestParse(t *testing.T) {
	twoRanks := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 3
vllm:num_requests_waiting{engine="1"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:kv_cache_usage_perc{engine="1"} 0.6
`
	tests := []struct {
		name        string
		text        string
		wantWaiting int
		wantUsage   float64
		wantErr     string
	}{
		{"vLLM page", page("7.0", "0.25"), 7, 0.25, ""},
		{"data-parallel ranks: waiting summed, usage averaged", twoRanks, 7, 0.4, ""},
		{"fractional waiting rounds", page("2.6", "0"), 3, 0, ""},
		{"the largest credible queue", page("1048576", "1"), 1 << 20, 1, ""},
		{"usage above 1", page("0", "1.5"), 0, 0, "not a fraction in [0, 1]"},
		{"negative usage", page("0", "-0.1"), 0, 0, "not a fraction in [0, 1]"},
		{"NaN usage", page("0", "NaN"), 0, 0, "kv_cache_usage_perc is NaN"},
		{"infinite usage", page("0", "+Inf"), 0, 0, "kv_cache_usage_perc is +Inf"},
		{"negative waiting", page("-2", "0.1"), 0, 0, "not a queue length"},
		{"NaN waiting", page("NaN", "0.1"), 0, 0, "num_requests_waiting is NaN"},
		{"infinite waiting", page("-Inf", "0.1"), 0, 0, "num_requests_waiting is -Inf"},
		{"absurd waiting", page("1e300", "0.1"), 0, 0, "not a queue length in [0, 1048576]"},
		{"one past the largest queue", page("1048577", "0.1"), 0, 0, "not a queue length"},
		{"missing waiting metric", strings.ReplaceAll(page("1", "0.1"), "vllm:num_requests_waiting", "other"), 0, 0, "no vllm:num_requests_waiting"},
		{"missing usage metric", strings.ReplaceAll(page("1", "0.1"), "vllm:kv_cache_usage_perc", "other"), 0, 0, "no vllm:kv_cache_usage_perc"},
		{"not the text format", "<html>hello</html>", 0, 0, "parse metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			waiting, usage, err := Parse(strings.NewReader(tt.text), "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				assert.Zero(t, waiting)
				assert.Zero(t, usage)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantWaiting, waiting)
			assert.InDelta(t, tt.wantUsage, usage, 1e-9)
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(page("7", "0.25"))
	f.Add("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc +Inf\n")
	f.Add("vllm:num_requests_waiting 1e300\nvllm:kv_cache_usage_perc -1\n")
	f.Add("vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc NaN\n")
	f.Add("vllm:num_requests_waiting{a=\"1\"} 1e308\nvllm:num_requests_waiting{a=\"2\"} 1e308\nvllm:kv_cache_usage_perc 0\n")
	f.Fuzz(func(t *testing.T, text string) {
		waiting, usage, err := Parse(strings.NewReader(text), "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
		if err != nil {
			if waiting != 0 || usage != 0 {
				t.Fatalf("error %v with values %d, %v", err, waiting, usage)
			}
			return
		}
		if waiting < 0 || waiting > MaxWaiting || !(usage >= 0 && usage <= 1) {
			t.Fatalf("out of range: waiting %d, usage %v from %q", waiting, usage, text)
		}
	})
}

func TestScraperReportsEachWorkersLatestSignals(t *testing.T) {
	var waiting atomic.Int32
	waiting.Store(4)
	var failing atomic.Bool
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() || r.URL.Path != "/metrics" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprint(w, page(fmt.Sprint(waiting.Load()), "0.5"))
	}))
	defer busy.Close()
	json := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{}`)
	}))
	defer json.Close()

	clock := fakeclock.New(time.Unix(1000, 0))
	s, err := New(DefaultConfig(), []Worker{{Name: "busy", Address: busy.Listener.Addr().String()}, {Name: "json", Address: json.Listener.Addr().String()}}, nil, clock.Now, nil)
	require.NoError(t, err)
	ctx := context.Background()

	w, u := s.Signals("busy")
	assert.Equal(t, 0, w, "unknown before the first scrape")
	assert.Zero(t, u)
	s.ScrapeAll(ctx)
	w, u = s.Signals("busy")
	assert.Equal(t, 4, w)
	assert.Equal(t, 0.5, u)
	w, _ = s.Signals("json")
	assert.Equal(t, 0, w, "a page that is not the text format reads as unknown")

	waiting.Store(9)
	failing.Store(true)
	clock.Advance(time.Second)
	s.ScrapeAll(ctx)
	w, _ = s.Signals("busy")
	assert.Equal(t, 4, w, "a failed scrape keeps the last reading while it is fresh")
	clock.Advance(3 * time.Second)
	w, _ = s.Signals("busy")
	assert.Equal(t, 4, w, "4 s old: within 3 intervals (3 s) plus the timeout (1 s)")
	clock.Advance(time.Millisecond)
	w, u = s.Signals("busy")
	assert.Equal(t, 0, w, "a worker silent for 3 intervals plus a timeout reads as unknown, not frozen")
	assert.Zero(t, u)

	failing.Store(false)
	s.ScrapeAll(ctx)
	w, _ = s.Signals("busy")
	assert.Equal(t, 9, w)

	s.SetWorkers([]Worker{{Name: "json", Address: json.Listener.Addr().String()}})
	w, _ = s.Signals("busy")
	assert.Equal(t, 0, w, "a removed worker is forgotten")
}

// EngineLoad tells the saturation rule how old a reading is, and that a worker never
// read or silent past the staleness is unknown (not idle, as Signals' zeros read).
func TestEngineLoadSaysHowOldAReadingIsAndWhenItIsUnknown(t *testing.T) {
	var failing atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page("6", "0.25"))
	}))
	defer engine.Close()
	clock := fakeclock.New(time.Unix(1000, 0))
	s, err := New(DefaultConfig(), []Worker{{Name: "w", Address: engine.Listener.Addr().String()}}, nil, clock.Now, nil)
	require.NoError(t, err)
	type reading struct {
		waiting int
		usage   float64
		age     time.Duration
		ok      bool
	}
	read := func() reading {
		w, u, age, ok := s.EngineLoad("w")
		return reading{w, u, age, ok}
	}
	assert.Equal(t, reading{}, read(), "never read")
	s.ScrapeAll(context.Background())
	assert.Equal(t, reading{6, 0.25, 0, true}, read())
	failing.Store(true)
	clock.Advance(time.Second)
	s.ScrapeAll(context.Background())
	assert.Equal(t, reading{6, 0.25, time.Second, true}, read(), "a failed scrape keeps the last reading, a second older")
	clock.Advance(3*time.Second + time.Millisecond)
	assert.Equal(t, reading{0, 0, 4*time.Second + time.Millisecond, false}, read(), "past 3 intervals plus a timeout: unknown")
	_, _, _, ok := s.EngineLoad("other")
	assert.False(t, ok, "a worker not scraped")
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for field, edit := range map[string]func(*Config){
		"engine_metrics.path":            func(c *Config) { c.Path = "metrics" },
		"engine_metrics.interval":        func(c *Config) { c.Interval = 0 },
		"engine_metrics.timeout":         func(c *Config) { c.Timeout = -1 },
		"engine_metrics.waiting_metric":  func(c *Config) { c.WaitingMetric = "" },
		"engine_metrics.kv_usage_metric": func(c *Config) { c.KVUsageMetric = "" },
	} {
		c := DefaultConfig()
		edit(&c)
		assert.ErrorContains(t, c.Validate(), field)
	}
}

// TestScraperRefusesUntrustworthyPages: a page with a NaN or absurd value never becomes
// a reading (the last sane one stands while fresh, then the load is unknown), and the
// operator is warned once per run of bad pages, not once per scrape.
func TestScraperRefusesUntrustworthyPages(t *testing.T) {
	var body atomic.Pointer[string]
	set := func(waiting, usage string) { p := page(waiting, usage); body.Store(&p) }
	set("2", "0.5")
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, *body.Load())
	}))
	defer engine.Close()
	var logs strings.Builder
	clock := fakeclock.New(time.Unix(1000, 0))
	s, err := New(DefaultConfig(), []Worker{{Name: "w", Address: engine.Listener.Addr().String()}}, nil, clock.Now,
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	require.NoError(t, err)
	ctx := context.Background()

	s.ScrapeAll(ctx)
	waiting, usage := s.Signals("w")
	require.Equal(t, 2, waiting)
	require.Equal(t, 0.5, usage)

	for _, bad := range [][2]string{{"0", "NaN"}, {"1e300", "0.1"}, {"+Inf", "0.1"}} {
		set(bad[0], bad[1])
		clock.Advance(time.Second)
		s.ScrapeAll(ctx)
		waiting, usage = s.Signals("w")
		assert.Equal(t, 2, waiting, "the last sane reading stands while fresh (%v)", bad)
		assert.Equal(t, 0.5, usage)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "engine metrics refused"), logs.String())
	clock.Advance(2 * time.Second)
	waiting, usage = s.Signals("w")
	assert.Zero(t, waiting, "stale: unknown, never the bad page's value")
	assert.Zero(t, usage)

	set("4", "0.25")
	s.ScrapeAll(ctx)
	waiting, usage = s.Signals("w")
	assert.Equal(t, 4, waiting)
	assert.Equal(t, 0.25, usage)
	set("0", "-1")
	s.ScrapeAll(ctx)
	assert.Equal(t, 2, strings.Count(logs.String(), "engine metrics refused"), "a new run of bad pages warns again")
}

// TestAScrapeOfAWorkerThatMovedOrLeftIsDropped: a scrape in flight when the worker
// moved (a pod restarted under its name) or left is the old engine's page: its load
// is not the new engine's, and a removed worker's reading is not kept, as the capacity
// and LoRA readings of that scrape are not.
func TestAScrapeOfAWorkerThatMovedOrLeftIsDropped(t *testing.T) {
	for _, tt := range []struct {
		name string
		next []Worker
	}{
		{"moved", []Worker{{Name: "a", Address: "192.0.2.1:80"}}},
		{"removed", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			arrived, release := make(chan struct{}), make(chan struct{})
			old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				close(arrived)
				<-release
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				fmt.Fprint(w, page("50", "0.9")) // the old engine, swamped
			}))
			defer old.Close()
			s, err := New(DefaultConfig(), []Worker{{Name: "a", Address: old.Listener.Addr().String()}}, nil, nil, nil)
			require.NoError(t, err)

			scraped := make(chan struct{})
			go func() { s.ScrapeAll(context.Background()); close(scraped) }()
			<-arrived
			s.SetWorkers(tt.next)
			close(release)
			<-scraped

			w, u := s.Signals("a")
			assert.Equal(t, 0, w, "the old engine's queue is not the worker's")
			assert.Zero(t, u)
			s.mu.Lock()
			defer s.mu.Unlock()
			assert.Empty(t, s.latest, "nothing kept of the old engine's page")
			assert.Empty(t, s.untrusted)
		})
	}
}

// TestAMovedWorkersReadingIsForgotten: a worker whose address changed is another
// engine: the old one's load and max_lora are not its own, even while still fresh.
func TestAMovedWorkersReadingIsForgotten(t *testing.T) {
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page("50", "0.9")+"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1\n")
	}))
	defer old.Close()
	s, err := New(DefaultConfig(), []Worker{{Name: "a", Address: old.Listener.Addr().String()}}, nil, nil, nil)
	require.NoError(t, err)
	s.ScrapeAll(context.Background())
	w, _ := s.Signals("a")
	require.Equal(t, 50, w)
	require.Equal(t, 2, s.MaxLoRAs("a"))

	s.SetWorkers([]Worker{{Name: "a", Address: "192.0.2.1:80"}})
	w, u := s.Signals("a")
	assert.Equal(t, 0, w, "unknown until the new engine's page is read")
	assert.Zero(t, u)
	assert.Zero(t, s.MaxLoRAs("a"))
}

// vllmPage is a page shaped like vLLM's: its gauges, then mostly histograms (16 of 25
// buckets), then the Python process's counters; 42 KB.
func vllmPage() []byte {
	var b strings.Builder
	labels := `engine="0",model_name="Qwen/Qwen3-8B"`
	for _, g := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n%s{%s} 0.25\n", g, g, g, labels)
	}
	for h := range 16 {
		name := fmt.Sprintf("vllm:histogram_%d_seconds", h)
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s histogram\n", name, name)
		for i := range 25 {
			fmt.Fprintf(&b, "%s_bucket{%s,le=\"%d.0\"} %d\n", name, labels, i, i*10)
		}
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} 250\n%s_sum{%s} 1234.5\n%s_count{%s} 250\n", name, labels, name, labels, name, labels)
	}
	for p := range 30 {
		fmt.Fprintf(&b, "# HELP python_gc_%d x\n# TYPE python_gc_%d counter\npython_gc_%d{generation=\"0\"} 123\n", p, p, p)
	}
	return []byte(b.String())
}

// The scraper reads an engine's load from its two metrics' lines: what Parse reads of
// the whole page, and the same whatever else the page holds.
func TestLoadIsReadFromItsMetricsLinesAlone(t *testing.T) {
	const w, u = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
	tests := []struct {
		name    string
		page    string
		waiting int
		usage   float64
		err     string
	}{
		{"a vLLM page", string(vllmPage()), 0, 0.25, ""},
		{"data-parallel ranks", page("3", "0.5") + "vllm:num_requests_waiting{engine=\"1\"} 4\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n", 7, 0.6, ""},
		{"a broken line elsewhere", page("2", "0.5") + "vllm:other{ 1\n", 2, 0.5, ""},
		{"a metric named like it", page("2", "0.5") + "vllm:num_requests_waiting_by_reason{reason=\"x\"} 9\n", 2, 0.5, ""},
		{"no waiting metric", "vllm:kv_cache_usage_perc 0.5\n", 0, 0, "no vllm:num_requests_waiting"},
		{"a NaN usage", page("1", "NaN"), 0, 0, "is NaN"},
		{"not the text format", `{"waiting": 1}`, 0, 0, "no vllm:num_requests_waiting"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			waiting, usage, err := parseLoad([]byte(tt.page), w, u)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.waiting, waiting)
			assert.InDelta(t, tt.usage, usage, 1e-9)
		})
	}
	whole, wholeUsage, err := Parse(bytes.NewReader(vllmPage()), w, u)
	require.NoError(t, err)
	lines, linesUsage, err := parseLoad(vllmPage(), w, u)
	require.NoError(t, err)
	assert.Equal(t, [2]any{whole, wholeUsage}, [2]any{lines, linesUsage})
}

func BenchmarkParseLoadOfAVLLMPage(b *testing.B) {
	p := vllmPage()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, _, err := parseLoad(p, "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseWholeVLLMPage is what a scrape cost when it parsed the whole page
// (Parse), the baseline of BenchmarkParseLoadOfAVLLMPage.
func BenchmarkParseWholeVLLMPage(b *testing.B) {
	p := vllmPage()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, _, err := Parse(bytes.NewReader(p), "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"); err != nil {
			b.Fatal(err)
		}
	}
}

// An h2c pool's engines may speak HTTP/2 over cleartext alone: a worker said to speak
// h2c is scraped so, the others over HTTP/1.1.
func TestScrapesSpeakEachWorkersProtocol(t *testing.T) {
	tests := []struct {
		name        string
		h2cOnly     bool // the engine refuses HTTP/1.1
		workerH2C   bool
		wantWaiting int // 0: the scrape failed
		wantProto   string
	}{
		{"an HTTP/1.1 worker is scraped over HTTP/1.1", false, false, 7, "HTTP/1.1"},
		{"an h2c worker is scraped over h2c", true, true, 7, "HTTP/2.0"},
		{"an h2c-only engine refuses HTTP/1.1 scrapes: the worker must say h2c", true, false, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var proto atomic.Value
			proto.Store("")
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" { // an HTTP/1.1 server's "PRI *", h2c's preface
					return
				}
				proto.Store(r.Proto)
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				fmt.Fprint(w, page("7", "0.5"))
			})
			srv := h2ctest.NewEngine(t, h, tt.h2cOnly)
			s, err := New(DefaultConfig(), []Worker{{Name: "a", Address: srv.Listener.Addr().String(), H2C: tt.workerH2C}}, nil, nil, nil)
			require.NoError(t, err)
			s.ScrapeAll(context.Background())
			waiting, _ := s.Signals("a")
			assert.Equal(t, tt.wantWaiting, waiting)
			assert.Equal(t, tt.wantProto, proto.Load())
		})
	}
}
