package enginemetrics

import (
	"bytes"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ParseRequests returns the requests an engine runs and queues: runningMetric plus
// waitingMetric (vLLM: vllm:num_requests_running and vllm:num_requests_waiting), each
// summed over its series (data-parallel ranks). Only the two metrics' lines are parsed.
// A metric that is absent is an error, and so is a value that is not a count in [0,
// MaxWaiting] (wrapping ErrBadValue): the page is hostile, and the count becomes load
// in every decision's cost.
func ParseRequests(page []byte, runningMetric, waitingMetric string) (int, error) {
	lines := append(linesOf(page, runningMetric), linesOf(page, waitingMetric)...)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(lines))
	if err != nil {
		return 0, fmt.Errorf("parse %s and %s: %w", runningMetric, waitingMetric, err)
	}
	total := 0
	for _, metric := range []string{runningMetric, waitingMetric} {
		value, ok := sum(families[metric])
		if !ok {
			return 0, fmt.Errorf("no %s in the engine's metrics", metric)
		}
		// The negated comparison also catches NaN.
		if !(value >= 0 && value <= MaxWaiting) || value != math.Trunc(value) {
			return 0, fmt.Errorf("%w: %s is %v, not a count of requests in [0, %d]", ErrBadValue, metric, value, MaxWaiting)
		}
		total += int(value)
	}
	return total, nil
}

// ReportRequests makes each scrape read the requests the worker's engine runs and
// queues (Config's RunningMetric and WaitingMetric) and call report with their sum, or
// with -1 when the scrape failed or the page gives no valid count. report is called
// under the scraper's lock, and only for workers still scraped at the address scraped;
// a worker SetWorkers removes or moves gets a -1, so that nothing reported of an engine
// outlives it.
// scoring.Bookings.SetEngineRequests is the report the server passes. Call it before Run.
func (s *Scraper) ReportRequests(report func(worker string, requests int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = requestsReport{report: report, lastErr: map[string]string{}}
}

// requestsReport is a scraper's reporting of engine requests, off until ReportRequests.
type requestsReport struct {
	report  func(worker string, requests int)
	lastErr map[string]string // by worker, the last error logged, under the scraper's lock
}

// readRequests reads w's running and waiting requests from its page (nil when the
// scrape failed with fetchErr) and reports them.
func (s *Scraper) readRequests(w Worker, page []byte, fetchErr error) {
	s.mu.Lock()
	on := s.requests.report != nil
	s.mu.Unlock()
	if !on {
		return
	}
	requests, err := -1, fetchErr
	if err == nil {
		if requests, err = ParseRequests(page, s.cfg.RunningMetric, s.cfg.WaitingMetric); err != nil {
			requests = -1
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.workers, w) { // removed or moved while this scrape ran
		return
	}
	// A page's error is logged once per change; a failed fetch is the health
	// checker's and the load scrape's to report.
	if fetchErr == nil {
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != s.requests.lastErr[w.Name] {
			if msg != "" {
				s.log.Warn("engine requests unread: traffic that bypasses kvroute is not counted on this worker until its page gives them", "worker", w.Name, "error", err)
			}
			s.requests.lastErr[w.Name] = msg
		}
	}
	s.requests.report(w.Name, requests)
}
