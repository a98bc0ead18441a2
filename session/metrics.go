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
