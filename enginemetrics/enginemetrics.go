// Package enginemetrics scrapes what each engine reports of its own load (DESIGN §5's
// optional second signal): requests waiting in its queue and the share of its KV cache
// in use, read from its Prometheus endpoint (vLLM: vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc). The router's bookings see only traffic through this
// kvroute; these numbers also see traffic from elsewhere. The GIE picker scores with
// them. A *Scraper is a router.Signals.
package enginemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"mime"
	"net/http"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/poll"
)

// Config is the `engine_metrics` section of kvroute's config.
type Config struct {
	// Path is the engines' Prometheus endpoint on each worker's address.
	Path string `yaml:"path" json:"path"`
	// Interval between scrapes of each worker.
	Interval time.Duration `yaml:"interval" json:"interval"`
	// Timeout of one scrape.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// WaitingMetric and KVUsageMetric name the series to read (summed over their label
	// sets, e.g. data-parallel ranks; the usage is averaged). SGLang: sglang:num_queue_reqs
	// and sglang:token_usage.
	WaitingMetric string `yaml:"waiting_metric" json:"waiting_metric"`
	KVUsageMetric string `yaml:"kv_usage_metric" json:"kv_usage_metric"`
	// RunningMetric names the requests the engine runs (summed over its label sets);
	// with WaitingMetric it gives the requests the engine holds. SGLang:
	// sglang:num_running_reqs.
	RunningMetric string `yaml:"running_metric" json:"running_metric"`
	// UnseenRequests counts the requests each engine holds beyond kvroute's bookings
	// (and its peers') at the last scrape in the worker's N(w): traffic that did not
	// come through this router (scoring.Bookings.SetEngineRequests).
	UnseenRequests bool `yaml:"unseen_requests" json:"unseen_requests"`
	// CapacityMetric and CapacityLabel locate the engine's KV capacity (the index's and
	// the cache-pressure term's, for a worker without capacity_blocks): the label's value
	// on the metric, or with the label empty the metric's value, in CapacityUnit
	// (blocks or tokens). vLLM: vllm:cache_config_info, num_gpu_blocks, blocks. SGLang:
	// sglang:max_total_num_tokens, "", tokens.
	CapacityMetric string `yaml:"capacity_metric" json:"capacity_metric"`
	CapacityLabel  string `yaml:"capacity_label" json:"capacity_label"`
	CapacityUnit   string `yaml:"capacity_unit" json:"capacity_unit"`
	// MaxCapacityBlocks bounds a scraped capacity; a page claiming more is ignored.
	MaxCapacityBlocks int `yaml:"max_capacity_blocks" json:"max_capacity_blocks"`
}

// DefaultConfig scrapes vLLM's /metrics every second with a 1 s timeout, and counts
// the requests its engine holds beyond kvroute's bookings.
func DefaultConfig() Config {
	return Config{Path: "/metrics", Interval: time.Second, Timeout: time.Second,
		WaitingMetric: "vllm:num_requests_waiting", KVUsageMetric: "vllm:kv_cache_usage_perc",
		RunningMetric: "vllm:num_requests_running", UnseenRequests: true,
		CapacityMetric: "vllm:cache_config_info", CapacityLabel: "num_gpu_blocks", CapacityUnit: UnitBlocks,
		MaxCapacityBlocks: DefaultMaxCapacityBlocks}
}

// FreshSignalsInterval is the longest scrape interval at which a picker that scores
// with the engines' queues (gie) still sees them change between most decisions.
// Between two scrapes every decision reads the same queues, so such a picker sends
// them all to the worker that looked least loaded at the last scrape. In replay (the
// Mooncake conversation trace at 4×, docs/BENCHMARKS.md "Several replicas and stale
// signals") the gie picker's TTFT p50 was 237 ms at 50 ms, 269 ms at 100 ms, 359 ms at
// 250 ms and 700 ms at 1 s, against 204 ms read at every decision.
const FreshSignalsInterval = 100 * time.Millisecond

// StaleSignalsWarning returns a warning for a picker that scores with the engines'
// queues when they are scraped less often than FreshSignalsInterval, or "" when they
// are fresh enough.
func (c Config) StaleSignalsWarning() string {
	if c.Interval <= FreshSignalsInterval {
		return ""
	}
	return fmt.Sprintf("engine_metrics.interval is %s: the picker scores with engine queues scraped that often, so decisions between two scrapes pile onto the worker that looked least loaded at the last one; set it to 50ms (the Gateway API Inference Extension's own default) or at most %s", c.Interval, FreshSignalsInterval)
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	switch {
	case c.Path == "" || c.Path[0] != '/':
		return fmt.Errorf("engine_metrics.path: must start with /, got %q", c.Path)
	case c.Interval <= 0:
		return fmt.Errorf("engine_metrics.interval: must be > 0, got %s", c.Interval)
	case c.Timeout <= 0:
		return fmt.Errorf("engine_metrics.timeout: must be > 0, got %s", c.Timeout)
	case c.WaitingMetric == "":
		return errors.New("engine_metrics.waiting_metric: must not be empty")
	case c.KVUsageMetric == "":
		return errors.New("engine_metrics.kv_usage_metric: must not be empty")
	case c.UnseenRequests && c.RunningMetric == "":
		return errors.New("engine_metrics.running_metric: must not be empty with unseen_requests on")
	}
	return c.validateCapacity()
}

// Worker is a worker to scrape: its name, the ip:port its metrics endpoint is on, and
// whether it is scraped over h2c.
type Worker = poll.Target

// Scraper holds the latest signals of every worker. Safe for concurrent use.
type Scraper struct {
	cfg     Config
	clients poll.Clients
	now     func() time.Time
	log     *slog.Logger
	guard   background.Guard // each scrape's

	mu      sync.Mutex
	workers []Worker
	latest  map[string]reading
	// untrusted holds the workers whose last scrape was refused for its values: warned
	// once per run of bad pages, not once per scrape.
	untrusted map[string]bool

	capacity capacityReport
	requests requestsReport
	// capacityOnly: the pages are read for capacity alone (the picker reads no load).
	capacityOnly bool
	// loraSlots is each worker's max_lora, as its page said last; loraErr the last
	// error reading it, logged once per change.
	loraSlots map[string]int
	loraErr   map[string]string
	// loraAdapters is each worker's running and waiting adapters, as its page said
	// last; read only while fresh.
	loraAdapters map[string]adapterReading
	// adapterResidency is how long a reported adapter is remembered (RememberAdapters).
	adapterResidency time.Duration
}

type reading struct {
	waiting int
	usage   float64
	at      time.Time
}

// New returns a scraper; nil now means time.Now, nil client a new http.Client, nil log
// discards. An h2c worker is scraped through a copy of client that speaks h2c
// (poll.NewClients).
func New(cfg Config, workers []Worker, client *http.Client, now func() time.Time, log *slog.Logger) (*Scraper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Scraper{cfg: cfg, clients: poll.NewClients(client), now: now, log: log, guard: background.NewGuard(background.LoopScrape, log, nil), workers: slices.Clone(workers), latest: map[string]reading{}, untrusted: map[string]bool{},
		loraSlots: map[string]int{}, loraErr: map[string]string{}, loraAdapters: map[string]adapterReading{}}, nil
}

// staleAfter is how many missed scrapes make a reading stale: a worker that stops
// answering reads as unknown (0, 0) rather than frozen at its last numbers.
const staleAfter = 3

// stale is how old a reading may be: staleAfter intervals, plus one timeout so that a
// slow but successful scrape (or a busy scraper) is not mistaken for silence.
func (s *Scraper) stale() time.Duration { return staleAfter*s.cfg.Interval + s.cfg.Timeout }

// Signals implements router.Signals: the worker's latest waiting requests and KV usage
// in [0,1], or 0 and 0 if unknown or stale.
func (s *Scraper) Signals(worker string) (int, float64) {
	s.mu.Lock()
	r, ok := s.latest[worker]
	s.mu.Unlock()
	if !ok || s.now().Sub(r.at) > s.stale() {
		return 0, 0
	}
	return r.waiting, r.usage
}

// EngineLoad implements router.EngineLoad: the worker's latest waiting requests and KV
// usage in [0,1], how long ago they were read, and ok false when there is no reading or
// it is stale (as Signals reads it: unknown). The scraper must read load: not
// CapacityOnly.
func (s *Scraper) EngineLoad(worker string) (waiting int, kvUtilization float64, age time.Duration, ok bool) {
	s.mu.Lock()
	r, found := s.latest[worker]
	s.mu.Unlock()
	if !found {
		return 0, 0, 0, false
	}
	if age = s.now().Sub(r.at); age > s.stale() {
		return 0, 0, age, false
	}
	return r.waiting, r.usage, age, true
}

// SetWorkers replaces the scraped workers (a config reload); removed ones are forgotten.
func (s *Scraper) SetWorkers(workers []Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := map[string]string{} // name → address
	for _, w := range workers {
		keep[w.Name] = w.Address
	}
	gone := func(name string) bool { _, ok := keep[name]; return !ok }
	// A worker whose address changed (a pod restarted under its name) is another
	// engine: none of the old one's load, adapters or adapter slots are its own.
	for _, w := range s.workers {
		if keep[w.Name] != w.Address {
			delete(s.latest, w.Name)
			delete(s.untrusted, w.Name)
			delete(s.loraSlots, w.Name)
			delete(s.loraErr, w.Name)
			delete(s.loraAdapters, w.Name)
			delete(s.requests.lastErr, w.Name)
			if s.requests.report != nil { // nor are its requests, and a removed one has none
				s.requests.report(w.Name, -1)
			}
		}
	}
	maps.DeleteFunc(s.latest, func(name string, _ reading) bool { return gone(name) })
	maps.DeleteFunc(s.untrusted, func(name string, _ bool) bool { return gone(name) })
	maps.DeleteFunc(s.capacity.last, func(name string, _ capacityReading) bool { return gone(name) })
	maps.DeleteFunc(s.loraSlots, func(name string, _ int) bool { return gone(name) })
	maps.DeleteFunc(s.loraErr, func(name string, _ string) bool { return gone(name) })
	s.workers = slices.Clone(workers)
}

// CapacityOnly makes the scrapes read the engines' KV capacity alone, not their load
// (waiting requests, KV usage), for a picker that reads no load: no parse, and no
// warning about a load value nobody uses. Call it before Run.
func (s *Scraper) CapacityOnly() { s.capacityOnly = true }

// CountPanics counts the scrapes that panicked in m (loop "scrape"). Call it before Run.
func (s *Scraper) CountPanics(m *background.Metrics) {
	s.guard = background.NewGuard(background.LoopScrape, s.log, m)
}

// Run scrapes every worker each interval until ctx is done.
func (s *Scraper) Run(ctx context.Context) { poll.Every(ctx, s.cfg.Interval, s.ScrapeAll) }

// ScrapeAll scrapes every worker once (poll.Each: concurrently, within its bound).
func (s *Scraper) ScrapeAll(ctx context.Context) {
	s.mu.Lock()
	workers := s.workers
	s.mu.Unlock()
	poll.Each(ctx, workers, s.scrape)
}

// scrape reads one worker's metrics page: its KV capacity and LoRA slots, then (unless
// CapacityOnly) its load. A scrape that panics (a bug its page reached) is recovered,
// logged and counted (kvroute_background_panics_total{loop="scrape"}), and ends as a
// failed one: the engine's requests read as unknown, and its last load stands while
// fresh.
func (s *Scraper) scrape(ctx context.Context, w Worker) {
	if err := s.guard.Do(func() error { s.read(ctx, w); return nil }); err != nil {
		s.failed(ctx, w, err)
	}
}

// read is one scrape of w, unguarded.
func (s *Scraper) read(ctx context.Context, w Worker) {
	page, err := s.fetch(ctx, w)
	if err != nil {
		s.failed(ctx, w, err)
		return
	}
	if ctx.Err() == nil { // a scrape cut short by shutdown says nothing of the engine
		s.readRequests(w, page, nil)
	}
	s.readCapacity(w, page)
	s.readLoRAInfo(w, page)
	if s.capacityOnly {
		return
	}
	waiting, usage, err := parseLoad(page, s.cfg.WaitingMetric, s.cfg.KVUsageMetric)
	s.recordLoad(ctx, w, waiting, usage, err)
}

// failed records a scrape of w that failed with err: no page, or a panic reading it.
// A failed scrape reports no capacity and leaves the LoRA info as it was.
func (s *Scraper) failed(ctx context.Context, w Worker, err error) {
	if ctx.Err() == nil {
		s.readRequests(w, nil, err)
	}
	s.recordLoad(ctx, w, 0, 0, err)
}

// recordLoad keeps w's load read by a scrape, or on err leaves the last reading to age.
func (s *Scraper) recordLoad(ctx context.Context, w Worker, waiting int, usage float64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.workers, w) { // removed or moved while this scrape ran
		return
	}
	bad := errors.Is(err, ErrBadValue)
	if bad && !s.untrusted[w.Name] {
		s.log.Warn("engine metrics refused: the last sane reading stands while fresh, then the load reads as unknown", "worker", w.Name, "error", err)
	}
	s.untrusted[w.Name] = bad
	if err != nil {
		if ctx.Err() == nil && !bad {
			s.log.Debug("engine metrics scrape failed", "worker", w.Name, "error", err)
		}
		return
	}
	s.latest[w.Name] = reading{waiting: waiting, usage: usage, at: s.now()}
}

// maxBody bounds one scrape: vLLM's /metrics is tens of kilobytes.
const maxBody = 8 << 20

// fetch GETs a worker's metrics page, at most maxBody bytes of it.
func (s *Scraper) fetch(ctx context.Context, w Worker) ([]byte, error) {
	header, body, err := poll.Get(ctx, s.clients.For(w), "http://"+w.Address+s.cfg.Path, s.cfg.Timeout, "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	if mediaType, _, err := mime.ParseMediaType(header.Get("Content-Type")); err == nil && mediaType != "text/plain" {
		return nil, fmt.Errorf("content type %q: want the Prometheus text format", mediaType)
	}
	return io.ReadAll(io.LimitReader(body, maxBody))
}

// MaxWaiting is the largest queue length a scrape may report. An engine queues at most
// thousands of requests; a larger (or fractional-overflowing, or non-finite) number is a
// broken exporter, and must not reach a cost as an int conversion of garbage.
const MaxWaiting = 1 << 20

// ErrBadValue is wrapped by the error for a page whose values cannot be load: NaN or
// ±Inf, a queue below 0 or above [MaxWaiting], a KV usage outside [0,1].
var ErrBadValue = errors.New("untrustworthy engine metric")

// Parse reads the Prometheus text format and returns the waiting metric summed over its
// series and the KV usage metric averaged over its series. A metric that is absent is an
// error: a misnamed metric must not read as an idle engine. So is a value that cannot be
// load (wrapping [ErrBadValue]): `min(1, max(0, NaN))` is NaN in Go, and a NaN or a
// garbage integer in one candidate's terms corrupts every comparison of costs.
func Parse(r io.Reader, waitingMetric, usageMetric string) (int, float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return 0, 0, fmt.Errorf("parse metrics: %w", err)
	}
	waiting, ok := sum(families[waitingMetric])
	if !ok {
		return 0, 0, fmt.Errorf("no %s in the engine's metrics", waitingMetric)
	}
	usageSum, ok := sum(families[usageMetric])
	if !ok {
		return 0, 0, fmt.Errorf("no %s in the engine's metrics", usageMetric)
	}
	usage := usageSum / float64(len(families[usageMetric].GetMetric()))
	// The negated comparisons also catch NaN, for which every comparison is false.
	if !(waiting >= 0 && waiting <= MaxWaiting) {
		return 0, 0, fmt.Errorf("%w: %s is %v, not a queue length in [0, %d]", ErrBadValue, waitingMetric, waiting, MaxWaiting)
	}
	if !(usage >= 0 && usage <= 1) {
		return 0, 0, fmt.Errorf("%w: %s is %v, not a fraction in [0, 1]", ErrBadValue, usageMetric, usage)
	}
	return int(math.Round(waiting)), usage, nil
}

// parseLoad is Parse of the page's lines of the two metrics alone, as the capacity and
// request counts are read. A vLLM page is mostly histograms: parsed whole, a 42 KB one
// took 1.9 ms and 563 KB a scrape, its two metrics' lines 36 µs and 7.7 KB
// (BenchmarkParseLoadOfAVLLMPage), which counts now that every worker's load is read
// for the saturation rule whatever the picker. Other lines of the page, well formed or
// not, change nothing.
func parseLoad(page []byte, waitingMetric, usageMetric string) (int, float64, error) {
	lines := append(linesOf(page, waitingMetric), linesOf(page, usageMetric)...)
	return Parse(bytes.NewReader(lines), waitingMetric, usageMetric)
}

// sum adds a gauge's (or untyped or counter) values over its series; false if none.
func sum(f *dto.MetricFamily) (float64, bool) {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0, false
	}
	var total float64
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			total += m.GetUntyped().GetValue()
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		default:
			return 0, false
		}
	}
	return total, true
}
