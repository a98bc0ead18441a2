package peers

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the exchange's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	live        prometheus.Gauge
	reports     *prometheus.CounterVec
	disconnects prometheus.Counter
	records     *prometheus.CounterVec
	dropped     prometheus.Counter
}

// NewMetrics registers kvroute_peers_live, kvroute_peers_reports_total,
// kvroute_peers_disconnects_total, kvroute_peers_records_received_total and
// kvroute_peers_records_dropped_total. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{
		live: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "peers", Name: "live",
			Help: "Other kvroute replicas whose booked load is counted (heard from within peers.stale_after)."}),
		reports: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "reports_total",
			Help: "Reports of booked load received from other replicas, by result: ok, or refused (malformed or out of bounds; the stream is dropped)."}, []string{"result"}),
		disconnects: promauto.With(reg).NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "disconnects_total",
			Help: "Watch streams to other replicas that could not be opened or broke (then reopened with back-off); a stream the peer ends cleanly after reporting (every minute, or shutting down) is not counted."}),
		records: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "records_received_total",
			Help: "Decisions' blocks received from other replicas (peers.share_blocks), by result: stored in this replica's index, unknown_worker (a worker this replica does not route to), moved_worker (made when the worker was at an address it has left since: another engine runs under its name), duplicate (already stored: a replica heard at two addresses), other_block_size (made with another block_size: a rollout)."}, []string{"result"}),
		dropped: promauto.With(reg).NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "records_dropped_total",
			Help: "This replica's decisions' blocks not sent to a watching replica: more were made within one peers.interval than are kept (65,536 blocks), or a watcher fell behind what is kept for it (4 MiB)."}),
	}
	for _, result := range []string{recordStored, recordUnknownWorker, recordMovedWorker, recordDuplicate, recordOtherBlockSize} {
		m.records.WithLabelValues(result)
	}
	m.reports.WithLabelValues("ok")
	m.reports.WithLabelValues("refused")
	return m
}

func (m *Metrics) reported(ok bool) {
	if m == nil {
		return
	}
	result := "ok"
	if !ok {
		result = "refused"
	}
	m.reports.WithLabelValues(result).Inc()
}

// Results of a received record, the label of kvroute_peers_records_received_total.
const (
	recordStored         = "stored"
	recordUnknownWorker  = "unknown_worker"
	recordMovedWorker    = "moved_worker"
	recordDuplicate      = "duplicate"
	recordOtherBlockSize = "other_block_size"
)

func (m *Metrics) receivedRecords(result string, n int) {
	if m != nil && n > 0 {
		m.records.WithLabelValues(result).Add(float64(n))
	}
}

func (m *Metrics) droppedRecords(n int) {
	if m != nil {
		m.dropped.Add(float64(n))
	}
}

func (m *Metrics) disconnected() {
	if m != nil {
		m.disconnects.Inc()
	}
}

func (m *Metrics) setLive(n int) {
	if m != nil {
		m.live.Set(float64(n))
	}
}
