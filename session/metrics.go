package session

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the session store's Prometheus series, read from it at scrape time.
type Metrics struct {
	entries prometheus.GaugeFunc
}

// NewMetrics registers kvroute_session_entries, the sessions remembered, read from s at
// scrape time. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer, s *Store) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{entries: promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute", Subsystem: "session", Name: "entries",
		Help: "Sessions remembered for session affinity (bounded by session.max_entries).",
	}, func() float64 { return float64(s.Len()) })}
}

// NewResponsesMetrics registers kvroute_responses_entries, the Responses API responses
// whose worker s remembers, read from s at scrape time. A nil reg returns nil.
func NewResponsesMetrics(reg prometheus.Registerer, s *Store) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{entries: promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kvroute", Subsystem: "responses", Name: "entries",
		Help: "Responses API responses whose storing worker is remembered, so that requests naming them go there (bounded by responses.max_entries).",
	}, func() float64 { return float64(s.Len()) })}
}
