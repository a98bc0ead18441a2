package scoring

import "github.com/prometheus/client_golang/prometheus"

// NewMetrics registers per-worker gauges of the booked load (P, D, N of DESIGN §3 and
// the requests still waiting for a first token, W), read from the ledger at scrape
// time: kvroute_scoring_prefill_tokens, kvroute_scoring_active_blocks,
// kvroute_scoring_active_requests and kvroute_scoring_pending_requests, labelled by
// worker, and kvroute_scoring_unseen_requests, what the worker's engine runs beyond
// every booking ([Bookings.SetEngineRequests]). workers lists the workers to report (so idle ones show 0). The series are
// read from the ledger, so there is nothing to record: Metrics only owns the collector.
// A nil reg returns nil; registering twice on one registry panics, as promauto does.
func NewMetrics(reg prometheus.Registerer, bookings *Bookings, workers func() []string) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{load: &loadCollector{bookings: bookings, workers: workers}}
	reg.MustRegister(m.load)
	return m
}

// Metrics are scoring's Prometheus series.
type Metrics struct {
	load *loadCollector
}

var (
	prefillDesc = prometheus.NewDesc("kvroute_scoring_prefill_tokens",
		"Uncached prompt tokens of requests booked on the worker that have not produced a first token (P).", []string{"worker"}, nil)
	blocksDesc = prometheus.NewDesc("kvroute_scoring_active_blocks",
		"Distinct prompt blocks of requests active on the worker (D).", []string{"worker"}, nil)
	requestsDesc = prometheus.NewDesc("kvroute_scoring_active_requests",
		"Requests active on the worker (N).", []string{"worker"}, nil)
	pendingDesc = prometheus.NewDesc("kvroute_scoring_pending_requests",
		"Requests booked on the worker that have not produced a first token (W).", []string{"worker"}, nil)
	unseenDesc = prometheus.NewDesc("kvroute_scoring_unseen_requests",
		"Requests the worker's engine ran or queued beyond every booking at its last scrape: traffic that did not come through kvroute, counted in N.", []string{"worker"}, nil)
)

type loadCollector struct {
	bookings *Bookings
	workers  func() []string
}

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- prefillDesc
	ch <- blocksDesc
	ch <- requestsDesc
	ch <- pendingDesc
	ch <- unseenDesc
}

func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.workers() {
		l := c.bookings.Load(w)
		ch <- prometheus.MustNewConstMetric(prefillDesc, prometheus.GaugeValue, float64(l.PrefillTokens), w)
		ch <- prometheus.MustNewConstMetric(blocksDesc, prometheus.GaugeValue, float64(l.ActiveBlocks), w)
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, float64(l.ActiveRequests), w)
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(l.PendingRequests), w)
		ch <- prometheus.MustNewConstMetric(unseenDesc, prometheus.GaugeValue, float64(c.bookings.UnseenRequests(w)), w)
	}
}
