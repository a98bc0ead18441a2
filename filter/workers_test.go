package filter

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/poll"
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
