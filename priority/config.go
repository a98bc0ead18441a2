package priority

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Defaults, as GIE's endpoint picker sets them (its saturation detector's
// DefaultQueueDepthThreshold, DefaultKVCacheUtilThreshold), and the objective header
// llm-d-router's reads (metadata.ObjectiveKey), whose deprecated alias LegacyHeader
// (metadata.OldObjectiveKey, GIE's name) it reads when the header is absent.
const (
	DefaultHeader               = "x-llm-d-inference-objective"
	LegacyHeader                = "x-gateway-inference-objective"
	DefaultQueueDepthThreshold  = 5
	DefaultKVCacheUtilThreshold = 0.8
)

// Bounds of what the config and the cluster may define, and of what a request may name.
const (
	// MaxObjectives bounds the objectives the config and the cluster each define: a
	// lookup per request whatever the count, and a table of at most a few MB.
	MaxObjectives = 10_000
	// MaxNameBytes bounds an objective's name: a Kubernetes object's name is at most
	// 253 bytes. A header value longer than this names no objective.
	MaxNameBytes = 253
	// MaxQueueDepthThreshold is the largest queue an engine may report
	// (enginemetrics.MaxWaiting): a threshold above it could never be passed.
	MaxQueueDepthThreshold = 1 << 20
	// maxStaleness bounds metrics_staleness_threshold: a reading an hour old says
	// nothing of an engine's load now.
	maxStaleness = time.Hour
)

// Config is the `priority` section of kvroute's config.
type Config struct {
	// Header is the request header naming the request's objective. Empty ignores it:
	// every request then has priority 0 and none is shed for saturation. DefaultHeader
	// or LegacyHeader reads both, as llm-d-router does (Headers).
	Header string `yaml:"header" json:"header"`
	// Objectives maps objective names to priorities, for objectives the cluster does
	// not define (an InferenceObjective of the same name takes precedence) and for
	// fleets without Kubernetes. Below 0 is sheddable. Reloadable.
	Objectives map[string]int `yaml:"objectives" json:"objectives"`
	// QueueDepthThreshold is the most requests a worker may have waiting (its engine's
	// queue, or the ones kvroute booked past its max_num_seqs) and still have capacity
	// for a sheddable request. 0: any waiting request saturates it.
	QueueDepthThreshold int `yaml:"queue_depth_threshold" json:"queue_depth_threshold"`
	// KVCacheUtilThreshold is the highest share of its KV cache a worker's engine may
	// report in use and still have capacity for a sheddable request, in (0, 1].
	KVCacheUtilThreshold float64 `yaml:"kv_cache_util_threshold" json:"kv_cache_util_threshold"`
	// MetricsStalenessThreshold is how old a worker's engine metrics may be for it to
	// have capacity; 0 takes engine_metrics' own staleness (3 intervals and a timeout,
	// when it reads a worker as unknown). GIE's 200 ms is four of its 50 ms scrapes.
	MetricsStalenessThreshold time.Duration `yaml:"metrics_staleness_threshold" json:"metrics_staleness_threshold"`
}

// DefaultConfig reads GIE's objective header, defines no objective, and has GIE's
// saturation thresholds: 5 waiting requests, 80 % of the KV cache.
func DefaultConfig() Config {
	return Config{Header: DefaultHeader, QueueDepthThreshold: DefaultQueueDepthThreshold, KVCacheUtilThreshold: DefaultKVCacheUtilThreshold}
}

// Headers are the request headers read for the objective, in order: the first one the
// request carries names it (its last value). DefaultHeader or LegacyHeader reads
// DefaultHeader, then its alias LegacyHeader, as llm-d-router's picker reads them
// (metadata.GetLowerCaseHeaderValue); another name reads that header alone; none when
// Header is empty. Names are lower case.
func (c Config) Headers() []string {
	switch h := strings.ToLower(c.Header); h {
	case "":
		return nil
	case DefaultHeader, LegacyHeader:
		return []string{DefaultHeader, LegacyHeader}
	default:
		return []string{h}
	}
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	switch h := strings.ToLower(c.Header); {
	case h != "" && !httpguts.ValidHeaderFieldName(h):
		return fmt.Errorf("priority.header: must be a header name or empty (off), got %q", c.Header)
	case c.QueueDepthThreshold < 0 || c.QueueDepthThreshold > MaxQueueDepthThreshold:
		return fmt.Errorf("priority.queue_depth_threshold: must be in [0, %d], got %d", MaxQueueDepthThreshold, c.QueueDepthThreshold)
	case !(c.KVCacheUtilThreshold > 0 && c.KVCacheUtilThreshold <= 1): // NaN fails too
		return fmt.Errorf("priority.kv_cache_util_threshold: must be in (0, 1], got %v", c.KVCacheUtilThreshold)
	case c.MetricsStalenessThreshold < 0 || c.MetricsStalenessThreshold > maxStaleness:
		return fmt.Errorf("priority.metrics_staleness_threshold: must be in [0, %s] (0: engine_metrics' own), got %s", maxStaleness, c.MetricsStalenessThreshold)
	}
	return ValidateObjectives(c.Objectives)
}

// ValidateObjectives reports the first invalid entry of the objectives section, in name
// order so that the error is the same at each load.
func ValidateObjectives(objectives map[string]int) error {
	if len(objectives) > MaxObjectives {
		return fmt.Errorf("priority.objectives: at most %d objectives, got %d", MaxObjectives, len(objectives))
	}
	names := make([]string, 0, len(objectives))
	for name := range objectives {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ValidName(name); err != nil {
			return fmt.Errorf("priority.objectives: %w", err)
		}
	}
	return nil
}

// ValidName reports whether name can name an objective: 1 to MaxNameBytes visible ASCII
// characters, as a header value carries them (a Kubernetes name is one).
func ValidName(name string) error {
	if name == "" || len(name) > MaxNameBytes {
		return fmt.Errorf("an objective's name has 1 to %d bytes, got %d", MaxNameBytes, len(name))
	}
	for i := range len(name) {
		if name[i] <= ' ' || name[i] > '~' {
			return fmt.Errorf("objective %q: only visible ASCII characters (a header value's), got byte %#x", name, name[i])
		}
	}
	return nil
}

// Saturation returns the saturation rule of the config's thresholds.
func (c Config) Saturation() Saturation {
	return Saturation{QueueDepth: c.QueueDepthThreshold, KVCacheUtil: c.KVCacheUtilThreshold, Staleness: c.MetricsStalenessThreshold}
}
