package filter

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

func TestSetWorkersDropsTheSeriesOfWorkersThatLeft(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.released("pod-a", "success")
	m.released("pod-b", "success")
	m.released("pod-b", "cancelled")
	m.SetWorkers([]poll.Target{{Name: "pod-a"}, {Name: "pod-c"}})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_filter_completions_total Routed requests whose booking was released, by worker and outcome (success, upstream_error, cancelled).
# TYPE kvroute_filter_completions_total counter
kvroute_filter_completions_total{outcome="success",worker="pod-a"} 1
`), "kvroute_filter_completions_total"))
	(*Metrics)(nil).SetWorkers(nil) // no metrics: nothing to drop
}

// Prefill workers are pods too: the disaggregation counter's prefill_worker series
// follow the fleet, and the series without one (decode-only outcomes) stay.
func TestSetWorkersDropsTheDisaggregationSeriesOfPrefillWorkersThatLeft(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, prefill := range []string{"prefill-a", "prefill-b", "prefill-b"} {
		m.decided(&router.Decision{Prefill: &router.Prefill{Decision: scoring.Decision{Worker: prefill}}}, 0)
	}
	m.decided(&router.Decision{DecodeOnly: router.DecodeOnlyUnderThreshold}, 0)
	m.SetWorkers([]poll.Target{{Name: "decode-a"}, {Name: "prefill-a"}})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_filter_disaggregation_total Routed requests in fleets with prefill workers, by how they were split: prefill (by the prefill worker named, then decoded by the destination), under_threshold (the destination missed fewer than disaggregate_tokens), no_prefill_worker (none eligible) or whole_api (an API the routing sidecar does not split: SGLang's /generate).
# TYPE kvroute_filter_disaggregation_total counter
kvroute_filter_disaggregation_total{outcome="prefill",prefill_worker="prefill-a"} 1
kvroute_filter_disaggregation_total{outcome="under_threshold",prefill_worker=""} 1
`), "kvroute_filter_disaggregation_total"))
}
