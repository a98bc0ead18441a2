package session

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are a store's Prometheus series, read from it at scrape time.
type Metrics struct {
	entries prometheus.GaugeFunc
}

// NewMetrics registers kvroute_session_entries, the sessions remembered, read from s at
// scrape time. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer, s *Store) *Metrics {
	return newEntries(reg, s, "session", "Sessions remembered for session affinity (bounded by session.max_entries).")
}

// NewResponsesMetrics registers kvroute_responses_entries, the Responses API responses
// whose worker s remembers, read from s at scrape time. A nil reg returns nil.
func NewResponsesMetrics(reg prometheus.Registerer, s *Store) *Metrics {
	return newEntries(reg, s, "responses", "Responses API responses whose storing worker is remembered, so that requests naming them go there (bounded by responses.max_entries).")
}

// newEntries registers kvroute_<subsystem>_entries, s's entries at scrape time.
func newEntries(reg prometheus.Registerer, s *Store, subsystem, help string) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{entries: promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute", Subsystem: subsystem, Name: "entries", Help: help,
	}, func() float64 { return float64(s.Len()) })}
}
