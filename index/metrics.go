package index

import "github.com/prometheus/client_golang/prometheus"

// NewMetrics registers kvroute_index_entries, the (block, worker) pairs the index holds,
// read at scrape time. A nil reg does nothing.
func NewMetrics(reg prometheus.Registerer, x *Index) error {
	if reg == nil {
		return nil
	}
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute", Subsystem: "index", Name: "entries",
		Help: "(block, worker) pairs held by the prefix index; bounded by the workers' capacities.",
	}, func() float64 { return float64(x.Entries()) }))
}
