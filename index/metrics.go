package index

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// NewMetrics registers kvroute_index_entries, the (block, worker) pairs the index holds
// as entries reports them at scrape time. A nil reg returns nil; registering twice on
// one registry panics, as promauto does.
func NewMetrics(reg prometheus.Registerer, entries func() int) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{entries: promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute", Subsystem: "index", Name: "entries",
		Help: "(block, worker) pairs held by the prefix index; bounded by the workers' capacities.",
	}, func() float64 { return float64(entries()) })}
	return m
}

// Metrics are the index's Prometheus series, read from the index at scrape time.
type Metrics struct {
	entries prometheus.GaugeFunc
}
