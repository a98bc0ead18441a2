package enginemetrics

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cacheConfig is vLLM's info gauge: its labels carry the cache's configuration.
func cacheConfig(blockSize, blocks string) string {
	return fmt.Sprintf(`# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size=%q,cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks=%q,num_gpu_blocks_override="None"} 1.0
`, blockSize, blocks)
}

func TestParseCapacity(t *testing.T) {
	vllm := func(page string, blockSize int) (int, error) {
		return ParseCapacity([]byte(page), "vllm:cache_config_info", "num_gpu_blocks", UnitBlocks, blockSize, DefaultMaxCapacityBlocks)
	}
	sglang := func(page string, blockSize int) (int, error) {
		return ParseCapacity([]byte(page), "sglang:max_total_num_tokens", "", UnitTokens, blockSize, DefaultMaxCapacityBlocks)
	}
	twoRanks := cacheConfig("16", "1000") + `vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="3000"} 1` + "\n"
	sglangPage := "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name=\"q\"} 161721.0\n"
	tests := []struct {
		name    string
		parse   func(string, int) (int, error)
		page    string
		bs      int
		want    int
		wantErr string
	}{
		{"vLLM, same block size", vllm, page("1", "0.1") + cacheConfig("16", "2048"), 16, 2048, ""},
		{"vLLM blocks of 16 in kvroute blocks of 64", vllm, cacheConfig("16", "2048"), 64, 512, ""},
		{"a whole number written as a float", vllm, cacheConfig("16", "2048.0"), 16, 2048, ""},
		{"data-parallel ranks are summed", vllm, twoRanks, 16, 4000, ""},
		{"SGLang tokens, floored to whole blocks", sglang, sglangPage, 64, 2526, ""},
		{"before profiling vLLM says None", vllm, cacheConfig("16", "None"), 16, 0, `num_gpu_blocks="None": not a whole number`},
		{"NaN", vllm, cacheConfig("16", "NaN"), 16, 0, "not a whole number"},
		{"infinite", vllm, cacheConfig("16", "+Inf"), 16, 0, "not a whole number"},
		{"fractional", vllm, cacheConfig("16", "20.5"), 16, 0, "not a whole number"},
		{"zero", vllm, cacheConfig("16", "0"), 16, 0, "outside [1, 1048576]"},
		{"negative", vllm, cacheConfig("16", "-5"), 16, 0, "outside"},
		{"absurd", vllm, cacheConfig("16", "1e300"), 16, 0, "outside"},
		{"just past the bound", vllm, cacheConfig("16", "1048577"), 16, 0, "outside"},
		{"ranks that add up past the bound", vllm, cacheConfig("16", "1000000") + `vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000000"} 1` + "\n", 16, 0, "outside"},
		{"less than one kvroute block", vllm, cacheConfig("16", "3"), 64, 0, "outside"},
		{"bad engine block size", vllm, cacheConfig("0", "2048"), 16, 0, "not a block size"},
		{"no such label", vllm, "vllm:cache_config_info{engine=\"0\"} 1\n", 16, 0, "no label num_gpu_blocks"},
		{"absent", vllm, page("1", "0.1"), 16, 0, "no vllm:cache_config_info"},
		{"SGLang NaN", sglang, "sglang:max_total_num_tokens NaN\n", 16, 0, "not a whole number"},
		{"a histogram is no capacity", sglang, "# TYPE sglang:max_total_num_tokens histogram\nsglang:max_total_num_tokens_bucket{le=\"+Inf\"} 1\nsglang:max_total_num_tokens_sum 1\nsglang:max_total_num_tokens_count 1\n", 16, 0, "no sglang:max_total_num_tokens"},
		{"only the metric's own lines are parsed", vllm, "garbage that is not the text format {{{\n" + cacheConfig("16", "64"), 16, 64, ""},
		{"a prefix of another metric is not it", vllm, "vllm:cache_config_info_total 5\n" + cacheConfig("16", "64"), 16, 64, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.parse(tt.page, tt.bs)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func FuzzParseCapacity(f *testing.F) {
	f.Add(cacheConfig("16", "2048"), "num_gpu_blocks", 16)
	f.Add(cacheConfig("16", "1e300"), "num_gpu_blocks", 64)
	f.Add("sglang:max_total_num_tokens 161721\n", "", 1)
	f.Add("vllm:cache_config_info{num_gpu_blocks=\"-0\"} NaN\nvllm:cache_config_info 1\n", "num_gpu_blocks", 3)
	f.Fuzz(func(t *testing.T, page, label string, blockSize int) {
		metric := "vllm:cache_config_info"
		if label == "" {
			metric = "sglang:max_total_num_tokens"
		}
		for _, unit := range []string{UnitBlocks, UnitTokens} {
			blocks, err := ParseCapacity([]byte(page), metric, label, unit, blockSize, 4096)
			if err == nil && (blocks < 1 || blocks > 4096) {
				t.Fatalf("capacity %d outside [1, 4096] from %q", blocks, page)
			}
		}
	})
}

// capacities records what a scraper reports.
type capacities struct {
	mu      sync.Mutex
	reports []string
}

func (c *capacities) report(worker, address string, blocks int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reports = append(c.reports, fmt.Sprintf("%s %d", worker, blocks))
}

func (c *capacities) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.reports
	c.reports = nil
	return out
}

func TestScraperReportsCapacityChangesOnly(t *testing.T) {
	var blocks atomic.Value
	blocks.Store("2048")
	var failing atomic.Bool
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		// No load signals on this page: the capacity is read all the same.
		fmt.Fprint(w, cacheConfig("16", blocks.Load().(string)))
	}))
	defer engine.Close()
	w := Worker{Name: "w", Address: engine.Listener.Addr().String()}
	s, err := New(DefaultConfig(), []Worker{w}, nil, nil, nil)
	require.NoError(t, err)
	got := &capacities{}
	s.ReportCapacity(16, got.report)
	ctx := context.Background()

	s.ScrapeAll(ctx)
	assert.Equal(t, []string{"w 2048"}, got.take())
	s.ScrapeAll(ctx)
	assert.Empty(t, got.take(), "unchanged: not reported again")

	failing.Store(true)
	s.ScrapeAll(ctx)
	assert.Empty(t, got.take(), "a failed scrape keeps the capacity: it must not flap with the network")

	failing.Store(false)
	blocks.Store("4096")
	s.ScrapeAll(ctx)
	assert.Equal(t, []string{"w 4096"}, got.take())

	blocks.Store("NaN")
	s.ScrapeAll(ctx)
	assert.Equal(t, []string{"w 0"}, got.take(), "a hostile value withdraws the scraped capacity")
	s.ScrapeAll(ctx)
	assert.Empty(t, got.take())

	// The worker moves: its capacity is reported again for the new address.
	blocks.Store("4096")
	s.ScrapeAll(ctx)
	require.Equal(t, []string{"w 4096"}, got.take())
	other := httptest.NewServer(engine.Config.Handler)
	defer other.Close()
	moved := Worker{Name: "w", Address: other.Listener.Addr().String()}
	s.SetWorkers([]Worker{moved})
	s.ScrapeAll(ctx)
	assert.Equal(t, []string{"w 4096"}, got.take(), "same value, another engine: reported")

	s.SetWorkers(nil)
	s.ScrapeAll(ctx)
	assert.Empty(t, got.take())
}

func TestCapacityConfigErrorsNameTheField(t *testing.T) {
	for field, edit := range map[string]func(*Config){
		"engine_metrics.capacity_metric":     func(c *Config) { c.CapacityMetric = "" },
		"engine_metrics.capacity_unit":       func(c *Config) { c.CapacityUnit = "bytes" },
		"engine_metrics.max_capacity_blocks": func(c *Config) { c.MaxCapacityBlocks = 0 },
	} {
		c := DefaultConfig()
		edit(&c)
		assert.ErrorContains(t, c.Validate(), field)
	}
	assert.True(t, strings.HasPrefix(DefaultConfig().CapacityMetric, "vllm:"))
}

func TestCapacityOnlyScrapesReadNoLoad(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, cacheConfig("16", "2048"))
		fmt.Fprint(w, "vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc NaN\n") // a broken load value
	}))
	defer engine.Close()
	w := Worker{Name: "w", Address: engine.Listener.Addr().String()}
	for _, capacityOnly := range []bool{false, true} {
		var logs bytes.Buffer
		s, err := New(DefaultConfig(), []Worker{w}, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
		require.NoError(t, err)
		got := &capacities{}
		s.ReportCapacity(16, got.report)
		if capacityOnly {
			s.CapacityOnly()
		}
		s.ScrapeAll(context.Background())
		assert.Equal(t, []string{"w 2048"}, got.take(), "the capacity is read either way")
		assert.Equal(t, !capacityOnly, strings.Contains(logs.String(), "engine metrics refused"),
			"the load is parsed (and its broken value refused) only when a picker reads it")
	}
}

// TestAnEnginesOtherBlockSizeIsWarnedOnce: the capacity is converted from the engine's
// blocks, but kvroute's blocks are not the engine's, so prefix hits are counted in the
// wrong blocks and KV events are refused: a config error, warned of once per change,
// with both sizes.
func TestAnEnginesOtherBlockSizeIsWarnedOnce(t *testing.T) {
	var engineBS atomic.Value
	engineBS.Store("32")
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, cacheConfig(engineBS.Load().(string), "2048"))
	}))
	defer engine.Close()
	var logs bytes.Buffer
	s, err := New(DefaultConfig(), []Worker{{Name: "w", Address: engine.Listener.Addr().String()}}, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	s.ReportCapacity(16, (&capacities{}).report)
	for range 3 {
		s.ScrapeAll(context.Background())
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "block size is not kvroute's"), logs.String())
	assert.Contains(t, logs.String(), "engine_block_size=32 block_size=16")
	engineBS.Store("16")
	s.ScrapeAll(context.Background())
	assert.Equal(t, 1, strings.Count(logs.String(), "block size is not kvroute's"), "the same size: nothing more")

	for _, tt := range []struct {
		page string
		want int
	}{
		{cacheConfig("16", "2048"), 16},
		{cacheConfig("0", "2048"), 0}, // refused: not a block size
		{"vllm:cache_config_info{num_gpu_blocks=\"2048\"} 1\n", 0},
		{"vllm:num_requests_waiting 1\n", 0},
	} {
		_, n, _ := parseCapacity([]byte(tt.page), "vllm:cache_config_info", "num_gpu_blocks", UnitBlocks, 16, DefaultMaxCapacityBlocks)
		assert.Equal(t, tt.want, n, tt.page)
	}
}
