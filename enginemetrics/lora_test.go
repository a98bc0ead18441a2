package enginemetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/enginename"
	"github.com/kvroute/kvroute/scoring"
)

func TestParseLoRAInfoReadsMaxLoRAs(t *testing.T) {
	tests := []struct {
		name, page string
		want       int
		wantErr    string
	}{
		{"LoRA off: no series", "vllm:num_requests_waiting 0\n", 0, ""},
		{"vLLM's gauge", `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.789828498802105e+09
`, 2, ""},
		{"the latest of several series", `vllm:lora_requests_info{max_lora="4",running_lora_adapters="a"} 1.70e+09
vllm:lora_requests_info{max_lora="8",running_lora_adapters="a,b"} 1.80e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters=""} 1.75e+09
`, 8, ""},
		{"a written float", `vllm:lora_requests_info{max_lora="3.0"} 1`, 3, ""},
		{"zero", `vllm:lora_requests_info{max_lora="0"} 1`, 0, "want a whole number in [1, 4096]"},
		{"absurd", `vllm:lora_requests_info{max_lora="1e9"} 1`, 0, "want a whole number in [1, 4096]"},
		{"a fraction", `vllm:lora_requests_info{max_lora="1.5"} 1`, 0, "want a whole number"},
		{"not a number", `vllm:lora_requests_info{max_lora="many"} 1`, 0, "want a whole number"},
		{"no label", `vllm:lora_requests_info{running_lora_adapters="a"} 1`, 0, "no label max_lora"},
		{"a broken line", "vllm:lora_requests_info{max_lora=\"2\" 1\n", 0, "vllm:lora_requests_info"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLoRAInfo([]byte(tt.page))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Zero(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.MaxLoRAs)
		})
	}
}

func TestParseLoRAInfoReadsTheAdapters(t *testing.T) {
	tests := []struct {
		name, page       string
		running, waiting []string
		wantErr          string
	}{
		{"vLLM's gauge", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="poem"} 1.7e+09`,
			[]string{"sql", "chat"}, []string{"poem"}, ""},
		{"none", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e+09`, nil, nil, ""},
		{"no adapter labels (older engines)", `vllm:lora_requests_info{max_lora="2"} 1.7e+09`, nil, nil, ""},
		{"the latest series' adapters", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="old"} 1.6e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="new",waiting_lora_adapters="next"} 1.8e+09
`, []string{"new"}, []string{"next"}, ""},
		{"blanks and repeats dropped", `vllm:lora_requests_info{max_lora="2",running_lora_adapters=" a,,a, b "} 1`, []string{"a", "b"}, nil, ""},
		{"a control character", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a\nb"} 1`, nil, nil, "control or format character U+000A"},
		{"a bidi override", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="s‮ql"} 1`, nil, nil, "U+202E"},
		{"an oversized name", `vllm:lora_requests_info{max_lora="2",waiting_lora_adapters="` + strings.Repeat("x", enginename.MaxBytes+1) + `"} 1`, nil, nil, "more than 512"},
		{"too many names", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="` + manyNames(MaxScrapedLoRAs+1) + `"} 1`, nil, nil, "more than 4096 adapters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := ParseLoRAInfo([]byte(tt.page))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				assert.Zero(t, info.MaxLoRAs, "a page refused is refused whole")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, 2, info.MaxLoRAs)
			assert.Equal(t, tt.running, info.Running)
			assert.Equal(t, tt.waiting, info.Waiting)
		})
	}
}

func manyNames(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint("a", i)
	}
	return strings.Join(names, ",")
}

// TestScraperReportsTheEnginesAdapters: the running and waiting adapters of a page are
// reported together, each once, until the worker has not been read for 3 intervals and
// a timeout; a page without adapters forgets them at once.
func TestScraperReportsTheEnginesAdapters(t *testing.T) {
	var page atomic.Value
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters="chat,sql"} 1` + "\n")
	srv := servePage(t, &page)
	now := time.Unix(1e9, 0)
	cfg := DefaultConfig()
	s, err := New(cfg, []Worker{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}}, nil, func() time.Time { return now }, nil)
	require.NoError(t, err)
	s.CapacityOnly()
	assert.Nil(t, s.EngineAdapters("w0"), "unknown before a scrape")
	s.ScrapeAll(context.Background())
	assert.Equal(t, []string{"sql", "chat"}, s.EngineAdapters("w0"))
	assert.Equal(t, 2, s.MaxLoRAs("w0"))

	now = now.Add(3*cfg.Interval + cfg.Timeout)
	assert.Equal(t, []string{"sql", "chat"}, s.EngineAdapters("w0"), "fresh for 3 intervals and a timeout")
	now = now.Add(time.Millisecond)
	assert.Nil(t, s.EngineAdapters("w0"), "then stale")

	s.ScrapeAll(context.Background())
	require.NotNil(t, s.EngineAdapters("w0"))
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1` + "\n")
	s.ScrapeAll(context.Background())
	assert.Nil(t, s.EngineAdapters("w0"), "without a residency, only the last page counts")

	s.RememberAdapters(30 * time.Second)
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="poem",waiting_lora_adapters=""} 1` + "\n")
	s.ScrapeAll(context.Background())
	now = now.Add(time.Second)
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1` + "\n")
	s.ScrapeAll(context.Background())
	assert.Equal(t, []string{"poem"}, s.EngineAdapters("w0"), "remembered for the residency")
	s.SetWorkers([]Worker{{Name: "w0", Address: "127.0.0.1:1"}})
	assert.Nil(t, s.EngineAdapters("w0"), "a worker that moved runs none of the old engine's adapters")

	s.SetWorkers([]Worker{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}})
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="poem",waiting_lora_adapters=""} 1` + "\n")
	s.ScrapeAll(context.Background())
	require.Equal(t, []string{"poem"}, s.EngineAdapters("w0"))
	s.SetWorkers(nil)
	assert.Nil(t, s.EngineAdapters("w0"), "a removed worker runs none")
}

func FuzzParseMaxLoRAs(f *testing.F) {
	f.Add("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql\"} 1.7e+09\n")
	f.Add("vllm:lora_requests_info{max_lora=\"4\"} NaN\nvllm:lora_requests_info{max_lora=\"9999\"} +Inf\n")
	f.Add("# TYPE vllm:lora_requests_info counter\nvllm:lora_requests_info{max_lora=\"-0\"} 1\n")
	f.Add("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"b,c\"} 1\n")
	f.Fuzz(func(t *testing.T, page string) {
		info, err := ParseLoRAInfo([]byte(page))
		n := info.MaxLoRAs
		if err != nil && (n != 0 || info.Running != nil || info.Waiting != nil) {
			t.Fatalf("error %v with %+v", err, info)
		}
		if n < 0 || n > MaxScrapedLoRAs {
			t.Fatalf("max_lora %d outside [0, %d] from %q", n, MaxScrapedLoRAs, page)
		}
		if len(info.Running)+len(info.Waiting) > MaxScrapedLoRAs {
			t.Fatalf("%d adapters named", len(info.Running)+len(info.Waiting))
		}
		for _, name := range append(slices.Clone(info.Running), info.Waiting...) {
			if name == "" || enginename.Check(name) != nil || strings.Contains(name, ",") {
				t.Fatalf("kept adapter name %q", name)
			}
		}
	})
}

// AdapterMemory keeps an adapter for residency after the last report naming it, as the
// router keeps its own adapters after their last request, and never more than
// MaxScrapedLoRAs of them.
func TestAdapterMemoryRemembersForTheResidency(t *testing.T) {
	start := time.Unix(1e9, 0)
	var m AdapterMemory
	steps := []struct {
		after    time.Duration
		reported []string
		want     []string
	}{
		{0, []string{"sql", "chat"}, []string{"sql", "chat"}},
		{10 * time.Second, []string{"poem"}, []string{"poem", "chat", "sql"}},
		{20 * time.Second, nil, []string{"poem", "chat", "sql"}},
		{30 * time.Second, nil, []string{"poem", "chat", "sql"}},
		{30*time.Second + time.Millisecond, nil, []string{"poem"}},
		{10 * time.Hour, nil, nil},
	}
	for _, step := range steps {
		got := m.Observe(step.reported, start.Add(step.after), 30*time.Second)
		assert.Equal(t, step.want, got, "after %s", step.after)
	}
	var zero AdapterMemory
	zero.Observe([]string{"a"}, start, 0)
	assert.Equal(t, []string{"b"}, zero.Observe([]string{"b"}, start.Add(time.Second), 0), "residency 0: only the last report")

	var flood AdapterMemory
	for i := range 3 {
		names := strings.Split(manyNames(MaxScrapedLoRAs), ",")
		for j := range names {
			names[j] = fmt.Sprint(i, names[j]) // new names each report
		}
		got := flood.Observe(names, start.Add(time.Duration(i)*time.Second), time.Hour)
		require.Len(t, got, MaxScrapedLoRAs)
		require.LessOrEqual(t, len(flood.seen), MaxScrapedLoRAs)
	}
	got := flood.Observe([]string{"new"}, start.Add(time.Minute), time.Hour)
	assert.Len(t, got, MaxScrapedLoRAs, "the latest reported, capped")
	assert.Equal(t, "new", got[0])
	for _, name := range got[1:] {
		require.True(t, strings.HasPrefix(name, "2"), "only the last flood's names are kept, got %q", name)
	}

	var over AdapterMemory
	assert.Len(t, over.Observe(strings.Split(manyNames(MaxScrapedLoRAs+1), ","), start, time.Hour), MaxScrapedLoRAs,
		"a report longer than the cap is cut, not a panic")
}

// An unreadable LoRA series forgets what the worker's engine was running: the memory
// is not kept past a page that cannot be read.
func TestScraperForgetsTheAdaptersOfAnUnreadablePage(t *testing.T) {
	var page atomic.Value
	page.Store(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql"} 1` + "\n")
	srv := servePage(t, &page)
	s, err := New(DefaultConfig(), []Worker{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}}, nil, nil, nil)
	require.NoError(t, err)
	s.CapacityOnly()
	s.RememberAdapters(time.Hour)
	s.ScrapeAll(context.Background())
	require.Equal(t, []string{"sql"}, s.EngineAdapters("w0"))
	page.Store(`vllm:lora_requests_info{max_lora="many",running_lora_adapters="sql"} 1` + "\n")
	s.ScrapeAll(context.Background())
	assert.Nil(t, s.EngineAdapters("w0"))
	assert.Zero(t, s.MaxLoRAs("w0"))
}

// LoRAState reads the last page as GIE's lora-affinity scorer does: the adapter runs
// there, a slot is free, its requests wait there, or every slot is taken.
func TestScraperLoRAStateForTheGIEPicker(t *testing.T) {
	tests := []struct {
		name, page, adapter string
		want                scoring.LoRAState
	}{
		{"runs", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1`, "sql", scoring.LoRARunning},
		{"a slot free", `vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1`, "chat", scoring.LoRASlotFree},
		{"waits there", `vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",waiting_lora_adapters="chat"} 1`, "chat", scoring.LoRAQueued},
		{"full", `vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",waiting_lora_adapters=""} 1`, "chat", scoring.LoRAFull},
		{"no LoRA", `vllm:num_requests_waiting 0`, "sql", scoring.LoRAUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var page atomic.Value
			page.Store(tt.page + "\n")
			srv := servePage(t, &page)
			now := time.Unix(1e9, 0)
			cfg := DefaultConfig()
			s, err := New(cfg, []Worker{{Name: "w0", Address: strings.TrimPrefix(srv.URL, "http://")}}, nil, func() time.Time { return now }, nil)
			require.NoError(t, err)
			s.CapacityOnly()
			assert.Equal(t, scoring.LoRAUnknown, s.LoRAState("w0", tt.adapter), "before a scrape")
			s.ScrapeAll(context.Background())
			assert.Equal(t, tt.want, s.LoRAState("w0", tt.adapter))
			now = now.Add(3*cfg.Interval + cfg.Timeout + time.Millisecond)
			if tt.want != scoring.LoRAUnknown {
				assert.Equal(t, scoring.LoRAUnknown, s.LoRAState("w0", tt.adapter), "a stale page says nothing")
			}
		})
	}
}

// servePage serves the metrics page page holds now, until the test ends.
func servePage(t *testing.T, page *atomic.Value) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(page.Load().(string)))
	}))
	t.Cleanup(srv.Close)
	return srv
}
