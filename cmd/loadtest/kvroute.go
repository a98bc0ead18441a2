package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/child"
)

// kvroute is the server under test: the real extproc binary, as deployed, in its own
// process so that its memory, goroutines and CPU are measured apart from the load.
type kvroute struct {
	proc      *child.Process
	grpcAddr  string
	adminURL  string
	blockSize int
	http      *http.Client
}

// kvrouteConfig builds the config kvroute runs with: the base file (or every default),
// with the listeners on loopback, the workers given, admin_pprof when profiling, and
// default_model defaultModel unless the base sets it or defaultModel is "" (the -api's
// bodies name no model: bodyAPI.defaultModel). Every other key, the tokenizer's
// included, is the base's.
func kvrouteConfig(base []byte, workers []map[string]any, defaultModel string, pprof bool) ([]byte, config.Config, error) {
	doc := map[string]any{}
	if err := yaml.Unmarshal(base, &doc); err != nil {
		return nil, config.Config{}, fmt.Errorf("-kvroute-config: %w", err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	doc["grpc_address"] = "127.0.0.1:0"
	doc["admin_address"] = "127.0.0.1:0"
	doc["workers"] = workers
	if _, ok := doc["log_level"]; !ok {
		doc["log_level"] = "info" // the "kvroute serving" line says where it listens
	}
	if _, ok := doc["default_model"]; !ok && defaultModel != "" {
		doc["default_model"] = defaultModel
	}
	if pprof {
		doc["admin_pprof"] = true
	}
	raw, err := yaml.Marshal(doc)
	if err != nil {
		return nil, config.Config{}, err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return nil, config.Config{}, fmt.Errorf("kvroute config: %w", err)
	}
	return raw, cfg, nil
}

// startKvroute writes the config to dir and starts bin/extproc with it.
func startKvroute(bin, dir string, raw []byte, cfg config.Config) (*kvroute, error) {
	path := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return nil, err
	}
	p, line, err := child.Start(filepath.Join(bin, "extproc"), []string{"-config", path}, "kvroute serving")
	if err != nil {
		return nil, err
	}
	var serving struct {
		GRPC  string `json:"grpc"`
		Admin string `json:"admin"`
	}
	if err := json.Unmarshal([]byte(line), &serving); err != nil || serving.GRPC == "" || serving.Admin == "" {
		p.Stop()
		return nil, fmt.Errorf("extproc: cannot read its addresses from %q", line)
	}
	return &kvroute{proc: p, grpcAddr: serving.GRPC, adminURL: "http://" + serving.Admin, blockSize: cfg.Router.BlockSize,
		http: &http.Client{Timeout: 2 * time.Minute}}, nil
}

// snapshot is what one scrape of kvroute's /metrics says.
type snapshot struct {
	at                 time.Time
	rss, heapInuse     float64
	goroutines         float64
	gcCycles           float64
	cpuSeconds         float64
	mallocs, allocated float64
	// bookings sums each booking gauge over the workers.
	bookings map[string]float64
	// stages are kvroute_filter_decision_duration_seconds by stage.
	stages       map[string]promHist
	requests     map[string]float64 // kvroute_filter_requests_total by outcome
	streamErrors float64
	panics       float64
	// backgroundPanics: kvroute_background_panics_total, every loop's summed.
	backgroundPanics float64
	indexEntries     float64 // (block, worker) pairs the index holds
	// healthFailures counts failed probes and 5xx answers (kvroute marks workers out
	// after them); workersOut is how many workers are out now.
	healthFailures float64
	workersOut     float64
	// peerReports is kvroute_peers_reports_total by result (ok, refused).
	peerReports map[string]float64
	// flowHeld is kvroute_flow_control_queued_requests, flowOutcomes
	// kvroute_flow_control_requests_total by outcome, and flowWait the wait of the
	// requests dispatched (kvroute_flow_control_wait_seconds{outcome="dispatched"}).
	flowHeld     float64
	flowOutcomes map[string]float64
	flowWait     promHist
}

// bookingGauges are the gauges of what requests hold on workers: all 0 when no
// request is in flight.
var bookingGauges = []string{"kvroute_scoring_active_requests", "kvroute_scoring_active_blocks", "kvroute_scoring_prefill_tokens"}

// promHist is a Prometheus histogram: cumulative counts at upper bounds.
type promHist struct {
	bounds []float64
	counts []float64
	count  float64
	sum    float64
}

func (k *kvroute) scrape(ctx context.Context) (snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.adminURL+"/metrics", nil)
	if err != nil {
		return snapshot{}, err
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return snapshot{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snapshot{}, fmt.Errorf("kvroute /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return snapshot{}, fmt.Errorf("kvroute /metrics: %w", err)
	}
	s := snapshot{at: time.Now(), bookings: map[string]float64{}, stages: map[string]promHist{}, requests: map[string]float64{},
		peerReports: map[string]float64{}, flowOutcomes: map[string]float64{}}
	value := func(name string) float64 {
		total := 0.0
		for _, m := range families[name].GetMetric() {
			total += m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetSummary().GetSampleCount())
		}
		return total
	}
	s.rss = value("process_resident_memory_bytes")
	s.heapInuse = value("go_memstats_heap_inuse_bytes")
	s.goroutines = value("go_goroutines")
	s.gcCycles = value("go_gc_duration_seconds")
	s.cpuSeconds = value("process_cpu_seconds_total")
	s.mallocs = value("go_memstats_mallocs_total")
	s.allocated = value("go_memstats_alloc_bytes_total")
	s.streamErrors = value("kvroute_filter_stream_errors_total")
	s.panics = value("kvroute_server_panics_total")
	s.backgroundPanics = value("kvroute_background_panics_total")
	s.indexEntries = value("kvroute_index_entries")
	s.healthFailures = value("kvroute_worker_health_failures_total")
	for _, m := range families["kvroute_worker_eligible"].GetMetric() {
		if m.GetGauge().GetValue() == 0 {
			s.workersOut++
		}
	}
	for _, g := range bookingGauges {
		s.bookings[g] = value(g)
	}
	for _, m := range families["kvroute_peers_reports_total"].GetMetric() {
		s.peerReports[label(m, "result")] += m.GetCounter().GetValue()
	}
	for _, m := range families["kvroute_filter_requests_total"].GetMetric() {
		s.requests[label(m, "outcome")] += m.GetCounter().GetValue()
	}
	for _, m := range families["kvroute_filter_decision_duration_seconds"].GetMetric() {
		s.stages[label(m, "stage")] = toPromHist(m.GetHistogram())
	}
	s.flowHeld = value("kvroute_flow_control_queued_requests")
	for _, m := range families["kvroute_flow_control_requests_total"].GetMetric() {
		s.flowOutcomes[label(m, "outcome")] += m.GetCounter().GetValue()
	}
	for _, m := range families["kvroute_flow_control_wait_seconds"].GetMetric() {
		if label(m, "outcome") == "dispatched" {
			s.flowWait = toPromHist(m.GetHistogram())
		}
	}
	return s, nil
}

func toPromHist(h *dto.Histogram) promHist {
	ph := promHist{count: float64(h.GetSampleCount()), sum: h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		ph.bounds = append(ph.bounds, b.GetUpperBound())
		ph.counts = append(ph.counts, float64(b.GetCumulativeCount()))
	}
	return ph
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// bookingsLeft sums the booking gauges.
func (s snapshot) bookingsLeft() float64 {
	total := 0.0
	for _, v := range s.bookings {
		total += v
	}
	return total
}

// since is the histogram of the observations between an earlier scrape and this one.
func (h promHist) since(earlier promHist) promHist {
	out := promHist{bounds: h.bounds, counts: make([]float64, len(h.counts)), count: h.count - earlier.count, sum: h.sum - earlier.sum}
	for i := range h.counts {
		out.counts[i] = h.counts[i]
		if i < len(earlier.counts) {
			out.counts[i] -= earlier.counts[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding the q-quantile, as
// PromQL's histogram_quantile does; its precision is the bucket width.
func (h promHist) quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	rank := q * h.count
	i := sort.Search(len(h.counts), func(i int) bool { return h.counts[i] >= rank })
	if i == len(h.counts) || math.IsInf(h.bounds[i], 1) {
		if len(h.bounds) < 2 {
			return 0
		}
		return seconds(h.bounds[len(h.bounds)-2]) // above the last finite bound
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	in := h.counts[i] - below
	if in <= 0 {
		return seconds(h.bounds[i])
	}
	return seconds(lower + (h.bounds[i]-lower)*(rank-below)/in)
}

func (h promHist) mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	return seconds(h.sum / h.count)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// profile saves kvroute's profile at path (admin_pprof must be on) under dir.
func (k *kvroute) profile(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.adminURL+path, nil)
	if err != nil {
		return err
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("kvroute %s: %s %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
