package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// sample is one point of the time series printed during the run.
type sample struct {
	At         time.Duration `json:"at"` // since the start
	Warm       bool          `json:"after_warmup"`
	RSS        float64       `json:"rss_bytes"`
	HeapInuse  float64       `json:"heap_inuse_bytes"`
	Goroutines float64       `json:"goroutines"`
	GCPerSec   float64       `json:"gc_per_second"`
	KvrouteCPU float64       `json:"kvroute_cpu_cores"`
	LoadCPU    float64       `json:"loadtest_cpu_cores"`
	ReqPerSec  float64       `json:"requests_per_second"`
	InFlight   int64         `json:"in_flight"`
	Bookings   float64       `json:"active_requests_booked"`
	Errors     int64         `json:"errors_so_far"`
	Index      float64       `json:"index_entries"`
	WorkersOut float64       `json:"workers_out"`
	// Held is the requests flow control held at the sample (only with it on).
	Held float64 `json:"flow_control_held,omitempty"`
}

// sampler scrapes kvroute every interval and prints a line.
type sampler struct {
	k     *kvroute
	g     *generator
	out   io.Writer
	every time.Duration
	// indexCapacity is the (block, worker) pairs kvroute's index can hold: RSS grows
	// until the index is full.
	indexCapacity float64
	// flowControl: kvroute runs flow control; the line says how many it holds.
	flowControl bool

	mu       sync.Mutex
	start    time.Time
	prev     snapshot
	prevCPU  time.Duration
	prevDone int64
	warm     bool
	warmCPU  time.Duration
	series   []sample
}

func (s *sampler) loop(ctx context.Context) {
	s.start = time.Now()
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.take(ctx)
		}
	}
}

func (s *sampler) markWarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.warm, s.warmCPU = true, selfCPU()
}

func (s *sampler) take(ctx context.Context) {
	snap, err := s.k.scrape(ctx)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintln(s.out, "loadtest: sample:", err)
		}
		return
	}
	cpu, done := selfCPU(), s.g.finished.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	dt := snap.at.Sub(s.prev.at).Seconds()
	p := sample{At: snap.at.Sub(s.start).Round(time.Second), Warm: s.warm, RSS: snap.rss, HeapInuse: snap.heapInuse,
		Goroutines: snap.goroutines, GCPerSec: (snap.gcCycles - s.prev.gcCycles) / dt,
		KvrouteCPU: (snap.cpuSeconds - s.prev.cpuSeconds) / dt, LoadCPU: (cpu - s.prevCPU).Seconds() / dt,
		ReqPerSec: float64(done-s.prevDone) / dt, InFlight: s.g.inFlight.Load(),
		Bookings: snap.bookings["kvroute_scoring_active_requests"], Errors: s.g.errorCount(), Index: snap.indexEntries,
		WorkersOut: snap.workersOut}
	held := ""
	if s.flowControl {
		p.Held = snap.flowHeld
		held = fmt.Sprintf("  held %4.0f", p.Held)
	}
	s.series = append(s.series, p)
	s.prev, s.prevCPU, s.prevDone = snap, cpu, done
	fmt.Fprintf(s.out, "t=%-5s %6.0f req/s  in flight %5d  booked %5.0f%s  errors %d | kvroute: rss %s heap %s index %.0f%% workers out %.0f goroutines %5.0f gc/s %5.1f cpu %.2f cores | loadtest cpu %.2f cores\n",
		p.At, p.ReqPerSec, p.InFlight, p.Bookings, held, p.Errors, mib(p.RSS), mib(p.HeapInuse), 100*p.Index/s.indexCapacity, p.WorkersOut, p.Goroutines, p.GCPerSec, p.KvrouteCPU, p.LoadCPU)
}

func (s *sampler) samples() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.series)
}

func mib(b float64) string { return fmt.Sprintf("%.1fMiB", b/(1<<20)) }

// latency summarises a histogram.
type latency struct {
	Count int64         `json:"count"`
	Mean  time.Duration `json:"mean"`
	P50   time.Duration `json:"p50"`
	P95   time.Duration `json:"p95"`
	P99   time.Duration `json:"p99"`
	P999  time.Duration `json:"p999"`
	Max   time.Duration `json:"max"`
}

func summarize(h *hist) latency {
	return latency{Count: h.count(), Mean: h.mean(), P50: h.quantile(0.50), P95: h.quantile(0.95), P99: h.quantile(0.99), P999: h.quantile(0.999), Max: h.max()}
}

// stage summarises one kvroute decision stage over the measurement.
type stage struct {
	Count float64       `json:"count"`
	Mean  time.Duration `json:"mean"`
	P50   time.Duration `json:"p50"`
	P99   time.Duration `json:"p99"`
}

// report is the run's outcome.
type report struct {
	opts                     options
	measureStart, measureEnd time.Time
	samples                  []sample
	loadCPU                  time.Duration // this process's CPU over the measurement
	indexCapacity            float64
	scrapeErr                error

	// API is the shape the sessions were sent in (-api) and Path where they went.
	API  string `json:"api"`
	Path string `json:"path"`
	// SamplesPerRequest is each request's parallel samples (-samples); 0 with
	// -samples-mix, whose classes SampleClasses reports apart.
	SamplesPerRequest int                `json:"samples_per_request"`
	SampleClasses     []classReport      `json:"sample_classes,omitempty"`
	Measured          time.Duration      `json:"measured"`
	Requests          int64              `json:"requests"`
	RequestsPerSec    float64            `json:"requests_per_second"`
	ChunksPerSec      float64            `json:"response_chunks_per_second"`
	RoundTrip         map[string]latency `json:"ext_proc_round_trip"`
	Stages            map[string]stage   `json:"kvroute_decision_stages"`
	StagesMeanSum     time.Duration      `json:"kvroute_decision_mean"`
	TTFT              latency            `json:"ttft"`
	Latency           latency            `json:"request_latency"`
	AllocsPerRequest  float64            `json:"kvroute_allocs_per_request"`
	BytesPerRequest   float64            `json:"kvroute_alloc_bytes_per_request"`
	GCPerSec          float64            `json:"kvroute_gc_per_second"`
	KvrouteCPU        float64            `json:"kvroute_cpu_cores"`
	LoadtestCPU       float64            `json:"loadtest_cpu_cores"`
	RSSFirst, RSSLast float64            `json:"-"`
	RSSMin, RSSMax    float64            `json:"-"`
	RSSSpread         float64            `json:"rss_spread_after_warmup"` // (max − min) / min
	GoroutinesMax     float64            `json:"kvroute_goroutines_max"`
	IndexFullAtWarm   float64            `json:"index_fill_after_warmup"` // share of capacity
	IndexFullAtEnd    float64            `json:"index_fill_at_end"`
	HitRatio          float64            `json:"cache_hit_ratio"`
	Resumed, Moved    int64              `json:"-"`
	// SGLangSessions is what the SGLang sessions did after the warm-up (-api
	// sglang-session); nil otherwise.
	SGLangSessions *sglangSessionsReport `json:"sglang_sessions,omitempty"`
	// sessionControls is the /open_session and /close_session requests sent over the
	// whole run, which kvroute routes by load (load_only).
	sessionControls int64
	// PerWorker counts the measured requests each worker answered; MaxOverMean is the
	// busiest worker's count over the mean of all workers' (1 when even).
	PerWorker          map[string]int64   `json:"requests_per_worker"`
	MaxOverMean        float64            `json:"requests_max_over_mean"`
	KvrouteOutcomes    map[string]float64 `json:"kvroute_requests_by_outcome"`
	KvrouteStreamErrs  float64            `json:"kvroute_stream_errors"`
	KvroutePanics      float64            `json:"kvroute_panics"`
	BackgroundPanics   float64            `json:"kvroute_background_panics"`
	HealthFailures     float64            `json:"kvroute_health_failures"`
	BookingsLeft       map[string]float64 `json:"bookings_left"`
	Samples            []sample           `json:"samples"`
	kvrouteExited      bool
	kvrouteTail        []string
	errors             map[string]int64
	errorExamples      map[string]string
	ErrorsByClass      map[string]int64 `json:"errors"`
	KvrouteExitedEarly bool             `json:"kvroute_exited"`
	// Replicas is how many kvroute processes routed (-replicas); Peers whether they
	// exchanged booked load. Only replica 0 is sampled; the others are checked for a
	// clean end (others).
	Replicas int  `json:"replicas"`
	Peers    bool `json:"peers"`
	others   []replicaEnd
	// peerReports is replica 0's kvroute_peers_reports_total by result at the end.
	peerReports map[string]float64
	// Proc is replica 0's /proc: peak RSS and CPU time.
	Proc procReport `json:"kvroute_proc"`
	// Hostile is each hostile kind's outcomes (-hostile-streams), apart from every
	// figure above but kvroute's own (its CPU, allocations and outcomes count them).
	Hostile map[string]hostileKindReport `json:"hostile,omitempty"`
	// Tenants is each tenant's figures (-tenants), and RateLimited the 429s retried over
	// the whole run (warm-up and drain included); nil without tenants.
	Tenants     map[string]tenantReport `json:"tenants,omitempty"`
	RateLimited *int64                  `json:"rate_limited_whole_run,omitempty"`
	// flowControl: kvroute ran flow control; FlowControl is what it did (nil with it
	// off).
	flowControl bool
	FlowControl *flowControlReport `json:"flow_control,omitempty"`
}

// flowControlReport is what kvroute's flow control did: its outcomes over the whole
// run, the wait of the requests it dispatched after the warm-up (interpolated within
// its histogram's buckets: 1, 5, 10, 50, 100, 250, 500 ms, 1 s, …), the most it held at
// a sample and what it held after the drain (0 unless a request leaked).
type flowControlReport struct {
	Outcomes  map[string]float64 `json:"outcomes"`
	Wait      stage              `json:"dispatched_wait"`
	WaitP95   time.Duration      `json:"dispatched_wait_p95"`
	HeldMax   float64            `json:"held_max_sampled"`
	HeldAtEnd float64            `json:"held_after_drain"`
}

// fill computes the figures: latency and throughput from the warm-up's end to the
// end of the load, bookings from the scrape after the drain.
func (r *report) fill(g *generator, m *measured, first, warm, end, last snapshot) {
	r.API, r.Path = string(r.opts.load.api), r.opts.load.api.path()
	r.SamplesPerRequest = r.opts.load.samples
	if r.opts.load.samplesMix != nil {
		r.SamplesPerRequest = 0
	}
	r.Measured = r.measureEnd.Sub(r.measureStart)
	secs := r.Measured.Seconds()
	r.SampleClasses = classReports(r.opts.load.samplesMix, m, r.opts.workers, secs)
	r.Requests = m.completed.Load()
	r.RequestsPerSec = float64(r.Requests) / secs
	r.ChunksPerSec = float64(m.chunks.Load()) / secs
	r.RoundTrip = map[string]latency{}
	for k, h := range m.roundTrips {
		r.RoundTrip[k] = summarize(h)
	}
	r.Stages = map[string]stage{}
	for name, h := range end.stages {
		d := h.since(warm.stages[name])
		r.Stages[name] = stage{Count: d.count, Mean: d.mean(), P50: d.quantile(0.5), P99: d.quantile(0.99)}
		r.StagesMeanSum += d.mean()
	}
	r.TTFT, r.Latency = summarize(&m.ttft), summarize(&m.latency)
	if routed := end.requests["routed"] - warm.requests["routed"]; routed > 0 {
		r.AllocsPerRequest = (end.mallocs - warm.mallocs) / routed
		r.BytesPerRequest = (end.allocated - warm.allocated) / routed
	}
	r.GCPerSec = (end.gcCycles - warm.gcCycles) / end.at.Sub(warm.at).Seconds()
	r.KvrouteCPU = (end.cpuSeconds - warm.cpuSeconds) / end.at.Sub(warm.at).Seconds()
	rss := []float64{warm.rss}
	// The warm-up's and the end's readings count too: a run shorter than -sample
	// has no sample between them.
	r.GoroutinesMax = max(warm.goroutines, end.goroutines)
	for _, s := range r.samples {
		if s.Warm {
			rss = append(rss, s.RSS)
			r.GoroutinesMax = max(r.GoroutinesMax, s.Goroutines)
		}
	}
	rss = append(rss, end.rss)
	r.RSSFirst, r.RSSLast, r.RSSMin, r.RSSMax = rss[0], rss[len(rss)-1], slices.Min(rss), slices.Max(rss)
	r.RSSSpread = (r.RSSMax - r.RSSMin) / r.RSSMin
	r.LoadtestCPU = r.loadCPU.Seconds() / secs
	r.IndexFullAtWarm, r.IndexFullAtEnd = warm.indexEntries/r.indexCapacity, end.indexEntries/r.indexCapacity
	if pt := m.promptTok.Load(); pt > 0 {
		r.HitRatio = float64(m.cachedTok.Load()) / float64(pt)
	}
	r.Resumed, r.Moved = m.resumed.Load(), m.moved.Load()
	if r.opts.load.api == apiSGLangSession {
		r.SGLangSessions = &sglangSessionsReport{Opened: m.opened.Load(), Closed: m.closed.Load(), Aborted: m.aborted.Load()}
		r.sessionControls = g.sessionControls.Load()
	}
	r.PerWorker, r.MaxOverMean = m.perWorker(r.opts.workers)
	r.KvrouteOutcomes = map[string]float64{}
	for k, v := range last.requests {
		if d := v - first.requests[k]; d > 0 {
			r.KvrouteOutcomes[k] = d
		}
	}
	r.KvrouteStreamErrs = last.streamErrors - first.streamErrors
	r.KvroutePanics = last.panics - first.panics
	r.BackgroundPanics = last.backgroundPanics - first.backgroundPanics
	r.HealthFailures = last.healthFailures - first.healthFailures
	r.BookingsLeft = last.bookings
	r.Tenants = tenantReports(r.opts.load.tenants, m, secs)
	if r.Tenants != nil {
		n := g.rateLimited.Load()
		r.RateLimited = &n
	}
	if r.flowControl {
		r.FlowControl = flowControlFigures(first, warm, end, last, r.samples)
	}
}

// sglangSessionsReport counts the SGLang sessions opened and closed after the warm-up,
// and their turns the engine aborted for a session it does not hold (their errors, of
// class session_aborted, are counted over the whole run with the others).
type sglangSessionsReport struct {
	Opened  int64 `json:"opened"`
	Closed  int64 `json:"closed"`
	Aborted int64 `json:"turns_aborted_unknown_session"`
}

// flowControlFigures reads flow control's series: outcomes from the first scrape to
// the last (after the drain), the dispatched requests' wait over the measurement.
func flowControlFigures(first, warm, end, last snapshot, samples []sample) *flowControlReport {
	fc := &flowControlReport{Outcomes: map[string]float64{}, HeldAtEnd: last.flowHeld}
	for k, v := range last.flowOutcomes {
		if d := v - first.flowOutcomes[k]; d > 0 {
			fc.Outcomes[k] = d
		}
	}
	w := end.flowWait.since(warm.flowWait)
	fc.Wait = stage{Count: w.count, Mean: w.mean(), P50: w.quantile(0.5), P99: w.quantile(0.99)}
	fc.WaitP95 = w.quantile(0.95)
	for _, s := range samples {
		if s.Warm {
			fc.HeldMax = max(fc.HeldMax, s.Held)
		}
	}
	return fc
}

// perWorker copies the counts and returns the busiest worker's count over the mean of
// workers' (workers the run started, some of which may have answered nothing, counting
// 0).
func (s *servedCounts) perWorker(workers int) (map[string]int64, float64) {
	s.mu.Lock()
	counts := maps.Clone(s.by)
	s.mu.Unlock()
	if counts == nil {
		counts = map[string]int64{}
	}
	total, busiest := int64(0), int64(0)
	for _, n := range counts {
		total += n
		busiest = max(busiest, n)
	}
	workers = max(workers, len(counts))
	if total == 0 || workers == 0 {
		return counts, 0
	}
	return counts, float64(busiest) * float64(workers) / float64(total)
}

// failures are what makes the run fail: any error, a leaked booking, kvroute's death.
func (r *report) failures() []string {
	var out []string
	if r.scrapeErr != nil {
		out = append(out, fmt.Sprintf("reading kvroute's metrics: %v", r.scrapeErr))
	}
	if r.kvrouteExited {
		out = append(out, "kvroute exited during the run; its last lines:\n  "+strings.Join(r.kvrouteTail, "\n  "))
	}
	if r.Peers {
		// The exchange must have worked: every replica accepted its peers' reports
		// (the shared secret, the streams) and refused none.
		ends := append([]replicaEnd{{replica: 0, peerReports: r.peerReports}}, r.others...)
		for _, o := range ends {
			if o.scrapeErr == nil && (o.peerReports["ok"] == 0 || o.peerReports["refused"] != 0) {
				out = append(out, fmt.Sprintf("kvroute replica %d: peers' reports accepted %g, refused %g (want some, and none)",
					o.replica, o.peerReports["ok"], o.peerReports["refused"]))
			}
		}
	}
	for _, o := range r.others {
		switch {
		case o.exited:
			out = append(out, fmt.Sprintf("kvroute replica %d exited during the run; its last lines:\n  %s", o.replica, strings.Join(o.tail, "\n  ")))
		case o.scrapeErr != nil:
			out = append(out, fmt.Sprintf("reading kvroute replica %d's metrics: %v", o.replica, o.scrapeErr))
		case o.bookingsLeft != 0:
			out = append(out, fmt.Sprintf("kvroute replica %d holds bookings after the drain: %g", o.replica, o.bookingsLeft))
		}
	}
	for _, class := range sortedKeys(r.errors) {
		out = append(out, fmt.Sprintf("%d errors (%s), e.g. %s", r.errors[class], class, r.errorExamples[class]))
	}
	if r.scrapeErr == nil && r.Requests == 0 {
		out = append(out, "no request completed after the warm-up")
	}
	for _, g := range sortedKeys(r.BookingsLeft) {
		if v := r.BookingsLeft[g]; v != 0 {
			out = append(out, fmt.Sprintf("%s = %g after every stream ended (want 0)", g, v))
		}
	}
	if fc := r.FlowControl; fc != nil && fc.HeldAtEnd != 0 {
		out = append(out, fmt.Sprintf("kvroute_flow_control_queued_requests = %g after every stream ended (want 0)", fc.HeldAtEnd))
	}
	out = append(out, r.notRouted()...)
	if r.KvrouteStreamErrs > 0 {
		out = append(out, fmt.Sprintf("kvroute counted %g stream errors (kvroute_filter_stream_errors_total)", r.KvrouteStreamErrs))
	}
	if r.KvroutePanics > 0 {
		out = append(out, fmt.Sprintf("kvroute recovered %g panics (kvroute_server_panics_total)", r.KvroutePanics))
	}
	if r.BackgroundPanics > 0 {
		out = append(out, fmt.Sprintf("kvroute recovered %g panics in its background loops (kvroute_background_panics_total)", r.BackgroundPanics))
	}
	return out
}

// notRouted names the requests kvroute answered but did not route on their prompt: the
// figures would then measure another path than the one the -api's bodies take (a
// Messages or Responses body kvroute cannot rebuild is routed by load, load_only).
// Without hostile streams every request is the load's, and each must be routed; with
// them, a hostile body may be routed by load (load_only_busy: no room to decode it) or
// refused, but none is unread (load_only). With tenants, a request may be refused for
// capacity (rate_limit_exceeded: a 429, retried).
func (r *report) notRouted() []string {
	var out []string
	if r.scrapeErr != nil {
		return nil
	}
	if r.KvrouteOutcomes["routed"] == 0 && r.Requests > 0 {
		out = append(out, fmt.Sprintf("kvroute routed no request on its prompt (outcomes %v)", r.KvrouteOutcomes))
	}
	for _, outcome := range sortedKeys(r.KvrouteOutcomes) {
		if outcome == "load_only" && r.opts.load.api == apiSGLangSession && r.KvrouteOutcomes[outcome] <= float64(r.sessionControls) {
			continue // the sessions' opens and closes: routed by load, no prompt
		}
		if outcome == "routed" || (r.opts.hostileStreams > 0 && outcome != "load_only") ||
			(r.opts.load.tenants != nil && outcome == rateLimitOutcome) {
			continue
		}
		out = append(out, fmt.Sprintf("kvroute answered %g requests %s, not routed on their prompt: the -api %s bodies (%s) did not all take the path measured",
			r.KvrouteOutcomes[outcome], outcome, r.opts.load.api, r.opts.load.api.path()))
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (r *report) print(w io.Writer) {
	o := r.opts
	fmt.Fprintf(w, "\nkvroute load test: -api %s (POST %s); %d streams, %s measured after a %s warm-up; %d mockworkers ×%g; prompts %d→%d tokens (+%d per turn), %d output tokens\n",
		o.load.api, o.load.api.path(), o.streams, r.Measured.Round(time.Second), o.warmup, o.workers, o.speed, o.load.prefixTokens, o.load.maxPromptTokens, o.load.userTokens, o.load.outputTokens)
	if o.load.sharedPrefix {
		fmt.Fprintln(w, "every session opens with the same system prompt (-shared-prefix)")
	}
	if o.load.samples > 1 {
		fmt.Fprintf(w, "each request asks for %d parallel samples (-samples, sampling_params.n); the figures are per request\n", o.load.samples)
	}
	if o.load.samplesMix != nil {
		fmt.Fprintf(w, "streams by parallel samples a request (-samples-mix %s, sampling_params.n): %d sequences at once over %d workers; the figures are per request\n",
			groupList(o.load.samplesMix), mixSequences(o.load.samplesMix), o.workers)
	}
	fmt.Fprintf(w, "throughput: %.0f requests/s (%d), %.0f response chunks/s; cache hit ratio %.3f; %d of %d resumed turns moved worker\n",
		r.RequestsPerSec, r.Requests, r.ChunksPerSec, r.HitRatio, r.Moved, r.Resumed)
	if ss := r.SGLangSessions; ss != nil {
		fmt.Fprintf(w, "SGLang sessions: %d opened, %d closed; %d turns aborted for a session their engine does not hold (of %d answered or aborted)\n",
			ss.Opened, ss.Closed, ss.Aborted, r.Requests+ss.Aborted)
	}
	fmt.Fprintf(w, "requests per worker:")
	for _, name := range sortedKeys(r.PerWorker) {
		fmt.Fprintf(w, " %s %d", name, r.PerWorker[name])
	}
	fmt.Fprintf(w, " (busiest over mean %.2f)\n", r.MaxOverMean)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ext_proc round trip (data plane)\tcount\tmean\tp50\tp95\tp99\tp99.9\tmax\t")
	for _, k := range messageKinds {
		l := r.RoundTrip[k]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k, l.Count, us(l.Mean), us(l.P50), us(l.P95), us(l.P99), us(l.P999), us(l.Max))
	}
	for _, row := range []struct {
		name string
		l    latency
	}{{"client TTFT", r.TTFT}, {"client request", r.Latency}} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.name, row.l.Count, us(row.l.Mean), us(row.l.P50), us(row.l.P95), us(row.l.P99), us(row.l.P999), us(row.l.Max))
	}
	tw.Flush()
	if len(r.SampleClasses) > 0 {
		r.printSampleClasses(w)
	}
	if len(r.Tenants) > 0 {
		r.printTenants(w)
	}
	if r.FlowControl != nil {
		r.printFlowControl(w)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kvroute decision stage (its histogram)\tcount\tmean\tp50\tp99\t")
	for _, name := range []string{"parse", "tokenize", "hash", "lookup", "score"} {
		s := r.Stages[name]
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t\n", name, s.Count, us(s.Mean), us(s.P50), us(s.P99))
	}
	fmt.Fprintf(tw, "sum of means\t\t%s\t\t\t\n", us(r.StagesMeanSum))
	tw.Flush()
	fmt.Fprintln(w, "(stage p50/p99 are interpolated within the histogram's buckets; the round trip's are within 2.5 %)")
	fmt.Fprintf(w, "kvroute process: %.2f cores, %.1f GC/s, %.0f allocs and %.1f KiB allocated per request; RSS after warm-up %s → %s (min %s, max %s, spread %.1f %%); goroutines ≤ %.0f\n",
		r.KvrouteCPU, r.GCPerSec, r.AllocsPerRequest, r.BytesPerRequest/1024, mib(r.RSSFirst), mib(r.RSSLast), mib(r.RSSMin), mib(r.RSSMax), 100*r.RSSSpread, r.GoroutinesMax)
	p := r.Proc
	fmt.Fprintf(w, "kvroute process (/proc every %s): peak RSS (VmHWM) %s, highest VmRSS after the warm-up %s; CPU %.1f s measured (%.2f cores), %.1f s since it started\n",
		time.Duration(p.Every*float64(time.Second)), mib(float64(p.PeakRSS)), mib(float64(p.MaxRSSMeasured)), p.CPUMeasured, p.CPUMeasured/r.Measured.Seconds(), p.CPUTotal)
	if p.Err != "" {
		fmt.Fprintf(w, "  (reading /proc failed at least once: %s)\n", p.Err)
	}
	if len(r.Hostile) > 0 {
		r.printHostile(w)
	}
	fmt.Fprintf(w, "kvroute's index: %.0f %% full after the warm-up, %.0f %% at the end (RSS grows until it is full)\n", 100*r.IndexFullAtWarm, 100*r.IndexFullAtEnd)
	fmt.Fprintf(w, "kvroute answered: %v; stream errors %g, panics %g (background %g); worker health failures %g (probes timing out under CPU starvation put workers out and clear their index entries)\n",
		r.KvrouteOutcomes, r.KvrouteStreamErrs, r.KvroutePanics, r.BackgroundPanics, r.HealthFailures)
	fmt.Fprintf(w, "errors: %d %v; bookings left after the drain: %v\n", sum(r.errors), r.errors, r.BookingsLeft)
	p99 := r.RoundTrip["request_body"].P99
	fmt.Fprintf(w, "goals: 0 errors %s; 0 bookings left %s; RSS flat within 10 %% %s; decision round trip (request_body) p99 %s ≤ 1 ms %s\n",
		check(sum(r.errors) == 0), check(r.BookingsLeft != nil && sumF(r.BookingsLeft) == 0), check(r.RSSSpread <= 0.10), us(p99), check(p99 > 0 && p99 <= time.Millisecond))
}

// printTenants prints each tenant's figures, in the flag's order.
func (r *report) printTenants(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "tenant (%s)\tstreams\tserved\treq/s\t429s\tturns past 2 retries\tother errors\tTTFT p50\tp95\tp99\trequest p50\tp95\tp99\t\n", r.opts.load.fairnessHeader)
	for _, t := range r.opts.load.tenants {
		x := r.Tenants[t.key]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t.key, x.Streams, x.Requests, x.RequestsPerSec,
			x.RateLimited, x.SDKGaveUp, sum(x.Errors), us(x.TTFT.P50), us(x.TTFT.P95), us(x.TTFT.P99), us(x.Latency.P50), us(x.Latency.P95), us(x.Latency.P99))
	}
	tw.Flush()
	var retried int64
	if r.RateLimited != nil {
		retried = *r.RateLimited
	}
	fmt.Fprintf(w, "(each tenant's times run from a turn's first attempt; a 429 is retried after its retry-after: %d over the whole run; \"past 2 retries\": turns an OpenAI SDK with its default max_retries would have failed)\n", retried)
}

// printSampleClasses prints each sample class's figures, in the flag's order.
func (r *report) printSampleClasses(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "samples a request (-samples-mix)\tstreams\tserved\treq/s\tmoved/resumed\tbusiest/mean\tTTFT p50\tp95\tp99\trequest p50\tp95\tp99\t")
	for _, c := range r.SampleClasses {
		fmt.Fprintf(tw, "n=%d\t%d\t%d\t%.1f\t%d/%d\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Samples, c.Streams, c.Requests, c.RequestsPerSec,
			c.Moved, c.Resumed, c.MaxOverMean, us(c.TTFT.P50), us(c.TTFT.P95), us(c.TTFT.P99), us(c.Latency.P50), us(c.Latency.P95), us(c.Latency.P99))
	}
	tw.Flush()
	for _, c := range r.SampleClasses {
		fmt.Fprintf(w, "  n=%d requests per worker:", c.Samples)
		for _, name := range sortedKeys(c.PerWorker) {
			fmt.Fprintf(w, " %s %d", name, c.PerWorker[name])
		}
		fmt.Fprintln(w)
	}
}

// printFlowControl prints what kvroute's flow control did.
func (r *report) printFlowControl(w io.Writer) {
	fc := r.FlowControl
	fmt.Fprintf(w, "kvroute flow control: outcomes %v over the run; dispatched after the warm-up %.0f, waited mean %s, p50 %s, p95 %s, p99 %s (interpolated in its buckets); held at most %.0f at a sample, %.0f after the drain\n",
		fc.Outcomes, fc.Wait.Count, us(fc.Wait.Mean), us(fc.Wait.P50), us(fc.WaitP95), us(fc.Wait.P99), fc.HeldMax, fc.HeldAtEnd)
}

// printHostile prints each hostile kind's outcomes: "routed" is a request kvroute
// routed (the worker refused it, as an engine would), any other a status the data
// plane or kvroute answered, or a client-side failure.
func (r *report) printHostile(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "hostile requests (apart)\tstreams\tbytes\tanswered\tper s\tmean\tp50\tp95\tp99\tmax\t")
	for _, k := range sortedKeys(r.Hostile) {
		h := r.Hostile[k]
		l := h.Latency
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%s\t%s\t%s\t%s\t%s\t\n", k, h.Streams, h.Bytes, h.Sent, h.PerSec, us(l.Mean), us(l.P50), us(l.P95), us(l.P99), us(l.Max))
	}
	tw.Flush()
	for _, k := range sortedKeys(r.Hostile) {
		h := r.Hostile[k]
		for _, o := range sortedKeys(h.Outcomes) {
			fmt.Fprintf(w, "  %s: %d %s, e.g. %q\n", k, h.Outcomes[o], o, h.Examples[o])
		}
	}
}

func check(ok bool) string {
	if ok {
		return "MET"
	}
	return "MISSED"
}

func sum(m map[string]int64) int64 {
	n := int64(0)
	for _, v := range m {
		n += v
	}
	return n
}

func sumF(m map[string]float64) float64 {
	n := 0.0
	for _, v := range m {
		n += v
	}
	return n
}

// us prints a duration in µs below 10 ms, else in ms.
func us(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

func (r *report) writeJSON(path string) error {
	r.Samples, r.ErrorsByClass, r.KvrouteExitedEarly = r.samples, r.errors, r.kvrouteExited
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
