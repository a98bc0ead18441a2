package priority

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestConfigValidationNamesTheKey(t *testing.T) {
	tooMany := map[string]int{}
	for i := range MaxObjectives + 1 {
		tooMany[fmt.Sprintf("o%d", i)] = -1
	}
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" valid
	}{
		{"the defaults", func(*Config) {}, ""},
		{"header off", func(c *Config) { c.Header = "" }, ""},
		{"header not a name", func(c *Config) { c.Header = "x objective" }, "priority.header: must be a header name"},
		{"objectives of any sign", func(c *Config) { c.Objectives = map[string]int{"batch": -1, "chat": 10, "default-ish": 0} }, ""},
		{"an empty objective name", func(c *Config) { c.Objectives = map[string]int{"": -1} }, "priority.objectives: an objective's name has 1 to 253 bytes, got 0"},
		{"a name no header value carries", func(c *Config) { c.Objectives = map[string]int{"two words": 1} }, `priority.objectives: objective "two words": only visible ASCII`},
		{"a name past a Kubernetes name", func(c *Config) { c.Objectives = map[string]int{strings.Repeat("o", 254): 1} }, "got 254"},
		{"too many objectives", func(c *Config) { c.Objectives = tooMany }, "priority.objectives: at most 10000 objectives"},
		{"queue depth 0: any queue saturates", func(c *Config) { c.QueueDepthThreshold = 0 }, ""},
		{"negative queue depth", func(c *Config) { c.QueueDepthThreshold = -1 }, "priority.queue_depth_threshold: must be in [0, 1048576], got -1"},
		{"queue depth past any engine's", func(c *Config) { c.QueueDepthThreshold = MaxQueueDepthThreshold + 1 }, "priority.queue_depth_threshold"},
		{"a full cache as the threshold", func(c *Config) { c.KVCacheUtilThreshold = 1 }, ""},
		{"KV threshold 0", func(c *Config) { c.KVCacheUtilThreshold = 0 }, "priority.kv_cache_util_threshold: must be in (0, 1], got 0"},
		{"KV threshold a percentage", func(c *Config) { c.KVCacheUtilThreshold = 80 }, "priority.kv_cache_util_threshold"},
		{"KV threshold NaN", func(c *Config) { c.KVCacheUtilThreshold = math.NaN() }, "priority.kv_cache_util_threshold"},
		{"GIE's staleness", func(c *Config) { c.MetricsStalenessThreshold = 200 * time.Millisecond }, ""},
		{"negative staleness", func(c *Config) { c.MetricsStalenessThreshold = -time.Second }, "priority.metrics_staleness_threshold"},
		{"staleness past an hour", func(c *Config) { c.MetricsStalenessThreshold = 2 * time.Hour }, "priority.metrics_staleness_threshold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestDefaultsAreGIEs(t *testing.T) {
	c := DefaultConfig()
	assert.Equal(t, "x-llm-d-inference-objective", c.Header, "llm-d-router's name; GIE's is read after it")
	assert.Equal(t, Saturation{QueueDepth: 5, KVCacheUtil: 0.8}, c.Saturation())
	assert.Empty(t, c.Objectives)
}

func TestOnlyNegativePrioritiesAreSheddable(t *testing.T) {
	for p, want := range map[int]bool{math.MinInt: true, -1: true, 0: false, 1: false, math.MaxInt: false} {
		assert.Equal(t, want, Sheddable(p), "priority %d", p)
	}
}

func TestWorkerHasCapacityByGIEsRule(t *testing.T) {
	s := Saturation{QueueDepth: 5, KVCacheUtil: 0.8}
	fresh := Load{Known: true, Age: 50 * time.Millisecond}
	with := func(edit func(*Load)) Load { l := fresh; edit(&l); return l }
	tests := []struct {
		name string
		s    Saturation
		load Load
		want bool
	}{
		{"an idle engine", s, fresh, true},
		{"metrics never read", s, Load{}, false},
		{"metrics stale for engine_metrics", s, with(func(l *Load) { l.Known = false }), false},
		{"a queue at the threshold", s, with(func(l *Load) { l.Waiting = 5 }), true},
		{"a queue past the threshold", s, with(func(l *Load) { l.Waiting = 6 }), false},
		{"KV use at the threshold", s, with(func(l *Load) { l.KVUtilization = 0.8 }), true},
		{"KV use past the threshold", s, with(func(l *Load) { l.KVUtilization = 0.81 }), false},
		{"booked past the batch slots: queued before the next scrape", s, with(func(l *Load) { l.BookedQueue = 6 }), false},
		{"booked within the threshold", s, with(func(l *Load) { l.BookedQueue = 5; l.Waiting = 2 }), true},
		{"older than a set staleness", Saturation{QueueDepth: 5, KVCacheUtil: 0.8, Staleness: 40 * time.Millisecond}, fresh, false},
		{"within a set staleness", Saturation{QueueDepth: 5, KVCacheUtil: 0.8, Staleness: time.Second}, fresh, true},
		{"queue depth 0 and one waiting", Saturation{QueueDepth: 0, KVCacheUtil: 1}, with(func(l *Load) { l.Waiting = 1 }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.s.HasCapacity(tt.load))
		})
	}
}

func TestObjectivesTheClusterDefinesTakePrecedence(t *testing.T) {
	o := NewObjectives(map[string]int{"batch": -1, "chat": 5})
	lookup := func(name string) [2]any { p, ok := o.Priority(name); return [2]any{p, ok} }
	assert.Equal(t, [2]any{-1, true}, lookup("batch"))
	assert.Equal(t, [2]any{0, false}, lookup("unknown"), "an unknown objective has priority 0, as in GIE")
	assert.Equal(t, [2]any{0, false}, lookup(""))

	o.SetCluster(map[string]int{"batch": 2, "offline": -10})
	assert.Equal(t, [2]any{2, true}, lookup("batch"), "the cluster's InferenceObjective wins over the config's")
	assert.Equal(t, [2]any{-10, true}, lookup("offline"))
	assert.Equal(t, [2]any{5, true}, lookup("chat"))

	o.SetConfigured(map[string]int{"chat": -3}) // a reload
	assert.Equal(t, [2]any{-3, true}, lookup("chat"))
	assert.Equal(t, [2]any{2, true}, lookup("batch"))

	o.SetCluster(nil) // the objectives deleted
	assert.Equal(t, [2]any{0, false}, lookup("batch"))
	assert.Equal(t, [2]any{0, false}, lookup("offline"))

	var zero Objectives
	p, ok := zero.Priority("batch")
	assert.Zero(t, p)
	assert.False(t, ok, "the zero table defines nothing")
}

// The objective header is llm-d-router's, read before GIE's name, its deprecated alias;
// a config naming either reads both, in that order; another name is read alone.
func TestObjectiveHeaders(t *testing.T) {
	tests := []struct {
		header string
		want   []string
	}{
		{DefaultConfig().Header, []string{"x-llm-d-inference-objective", "x-gateway-inference-objective"}},
		{"X-Gateway-Inference-Objective", []string{"x-llm-d-inference-objective", "x-gateway-inference-objective"}},
		{"X-Objective", []string{"x-objective"}},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			assert.Equal(t, tt.want, Config{Header: tt.header}.Headers())
		})
	}
}
