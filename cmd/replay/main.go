// Command replay measures routing policies by replaying a workload in virtual time
// through kvroute's router against simulated vLLM-like workers.
//
//	replay -workload sessions -seeds 1,2,3 -policies kv,kv:prefix_affinity_weight=4
//	replay -workload sessions -seeds 1-20 -policies kv,kvroute -baseline kv
//	replay -workload shared-prefix -max-num-seqs 4 -seeds 1-3 -policies gie,kv,kvroute
//	replay -workload mooncake -trace conversation.jsonl -workers 8 -policies gie,kv -format json
//	replay -workload compacting -session-header -seeds 1-20 -policies kvroute,kvroute:session_affinity_weight=16
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/replay"
	"github.com/kvroute/kvroute/sim"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	workload, trace, policies, seeds, indexSource, format string
	baseline                                              string
	workers, blockSize, numGPUBlocks, maxNumSeqs, batched int
	maxLoRAs                                              int
	hostBlocks, hostChunkBlocks                           int
	tiers, offloadTiers                                   string
	sessions                                              replay.SessionsConfig
	traceCfg                                              replay.TraceConfig
	jitterMs                                              int
	indexTTL, pendingTTL                                  time.Duration
	parallel                                              int
	sessionHeader                                         bool
	routerMaxNumSeqs                                      bool
	logDir                                                string
	replicas                                              int
	prefillWorkers                                        int
	sharedBookings                                        bool
	shareInterval                                         time.Duration
	shareBlocks                                           bool
	scrapeInterval                                        time.Duration
	noEngineAdapters                                      bool
	bypassShare                                           float64
	unseenRequests                                        bool
	maxActive                                             int
	holderWait                                            time.Duration
	holdOnSaturation                                      bool
	approximateOffload                                    bool
	dpRanks                                               int
	dpRouting                                             string
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := replay.DefaultSessions()
	fs.StringVar(&o.workload, "workload", "sessions", "sessions (Workload A), compacting (Workload A whose sessions compact their history), shared-prefix (sessions behind one system prompt) or mooncake (a JSONL trace)")
	fs.StringVar(&o.policies, "policies", "round_robin,kv", "comma-separated policies: round_robin, random, least_load, gie, gie-lora (gie with its lora-affinity scorer), kv, kv:<param>=<value>[,…], kvroute[:<param>=<value>,…], partition:<worker digit per new prefix>")
	fs.StringVar(&o.seeds, "seeds", "1", "seeds: a comma-separated list of seeds and ranges, e.g. 1,2,5-8")
	fs.StringVar(&o.baseline, "baseline", "kv", "policy the table's per-seed summary ratios are taken against")
	fs.StringVar(&o.indexSource, "index", replay.SourceApproximate, "index source: approximate or events")
	fs.StringVar(&o.format, "format", "table", "table or json")
	fs.IntVar(&o.workers, "workers", 0, "simulated workers (default 2 for sessions, 4 for shared-prefix, 8 for mooncake)")
	fs.IntVar(&o.blockSize, "block-size", 64, "KV block size in tokens")
	fs.IntVar(&o.numGPUBlocks, "num-gpu-blocks", 0, "KV blocks per worker (default 512 for sessions, 16384 for shared-prefix and mooncake)")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 0, "running requests per worker (default 8 for sessions, 4 for shared-prefix, 256 for mooncake)")
	fs.IntVar(&o.batched, "max-num-batched-tokens", 8192, "token budget per pass")
	fs.IntVar(&o.hostBlocks, "host-blocks", 0, "host (CPU offload) KV blocks per worker: the engines write every computed block through to host memory and load a prefix from there rather than recompute it, reporting the tier as \"CPU\" in their KV events (0: no host tier)")
	fs.IntVar(&o.hostChunkBlocks, "host-chunk-blocks", 0, "the host tier holds chunks of this many blocks, as LMCache (256-token chunks: 4 of 64 tokens): written when whole, loaded whole from the prompt's start, each stored chunk an event with its tokens; 0: blocks, as vLLM's CPU offloading")
	fs.BoolVar(&o.approximateOffload, "approximate-offload", false, "approximate index: keep the decisions' blocks a worker's capacity evicts as offloaded, a guess of the engines' host tiers without KV events (index.approximate_offload)")
	fs.StringVar(&o.tiers, "tiers", "device", "events index: comma-separated tiers whose blocks count as held (kv_events.tiers)")
	fs.StringVar(&o.offloadTiers, "offload-tiers", "host", "events index: comma-separated tiers indexed as offloaded and priced by offload_credit (kv_events.offload_tiers; empty: none)")
	fs.IntVar(&o.maxLoRAs, "max-loras", 0, "LoRA adapters a worker runs at once (vLLM --max-loras); 0: no limit")
	fs.IntVar(&o.sessions.Adapters, "lora-adapters", 0, "sessions workloads: run session i on LoRA adapter lora-<i mod N>; 0: all on the base model")
	fs.BoolVar(&o.routerMaxNumSeqs, "router-max-num-seqs", true, "give the router each worker's max_num_seqs (workers[].max_num_seqs); false: it sees batch pressure only through its bookings")
	fs.DurationVar(&o.indexTTL, "index-ttl", index.DefaultTTL, "approximate index TTL in virtual time, the server's index.ttl (0: capacity only)")
	fs.DurationVar(&o.pendingTTL, "pending-ttl", replay.DefaultPendingTTL, "events index: how long a decision's blocks count before the engine reports them (virtual time)")
	fs.IntVar(&o.parallel, "parallel", runtime.GOMAXPROCS(0), "runs at once")
	fs.IntVar(&o.sessions.Sessions, "sessions", def.Sessions, "sessions (shared-prefix: 32)")
	fs.IntVar(&o.sessions.Turns, "turns", def.Turns, "turns per session (shared-prefix: 6)")
	fs.IntVar(&o.sessions.SharedPrefixTokens, "shared-prefix-tokens", def.SharedPrefixTokens, "tokens of the system prompt every session shares (shared-prefix: 3000)")
	fs.IntVar(&o.sessions.PrefixTokens, "prefix-tokens", def.PrefixTokens, "tokens of each session's own stable prefix, after the shared one (shared-prefix: 0)")
	fs.IntVar(&o.sessions.UserTokens, "user-tokens", def.UserTokens, "new user tokens per turn")
	fs.IntVar(&o.sessions.OutputTokens, "output-tokens", def.OutputTokens, "output tokens per turn")
	fs.DurationVar(&o.sessions.StartSpread, "start-spread", def.StartSpread, "session starts are uniform in [0, this)")
	fs.DurationVar(&o.sessions.ThinkMin, "think-min", def.ThinkMin, "shortest pause between a turn's end and the next turn")
	fs.DurationVar(&o.sessions.ThinkMax, "think-max", def.ThinkMax, "longest pause")
	fs.IntVar(&o.sessions.CompactEvery, "compact-every", 0, "compacting: turns between compactions (default 4)")
	fs.IntVar(&o.sessions.SummaryTokens, "summary-tokens", 0, "compacting: tokens of the summary a compaction leaves (default 1000)")
	fs.BoolVar(&o.sessionHeader, "session-header", false, "send each request's session id as the session header (session affinity)")
	fs.StringVar(&o.trace, "trace", "", "Mooncake JSONL trace (mooncake workload)")
	fs.Float64Var(&o.traceCfg.Speedup, "speedup", 1, "divide trace timestamps by this")
	fs.IntVar(&o.jitterMs, "jitter-ms", 0, "seeded uniform jitter added to each trace arrival, in ms")
	fs.IntVar(&o.traceCfg.MaxRequests, "max-requests", 0, "replay only the first N trace rows (0: all)")
	fs.IntVar(&o.prefillWorkers, "prefill-workers", 0, "add this many prefill workers (role prefill): the -workers are then decode workers, and requests whose decode worker misses disaggregate_tokens are prefilled on one (disaggregated prefill/decode)")
	fs.IntVar(&o.replicas, "replicas", 1, "kvroute replicas, each with its own bookings and index; each request goes to one at random")
	fs.BoolVar(&o.sharedBookings, "shared-bookings", false, "with -replicas: one ledger of bookings for all replicas (what sharing bookings could buy; kvroute does not share them)")
	fs.DurationVar(&o.shareInterval, "share-interval", 0, "with -replicas: every replica tells the others what it has booked on each worker this often (virtual time; 0: never)")
	fs.BoolVar(&o.shareBlocks, "share-blocks", false, "with -share-interval: each exchange also carries the blocks each replica's decisions stored in its index, which the others store too (peers.share_blocks)")
	fs.DurationVar(&o.scrapeInterval, "scrape-interval", 0, "how often the engines' queue, KV usage and running LoRA adapters are sampled for the router (virtual time; 0: read at every decision)")
	fs.IntVar(&o.maxActive, "max-active", 0, "max_active_requests_per_worker of kvroute's router (every policy's), with flow control on: a request no worker can take is held, first come first served, and routed as soon as a request ends and a worker can take it (its TTFT counts the wait); 0: no limit. One replica, no prefill workers")
	fs.DurationVar(&o.holderWait, "holder-wait", 0, "with -max-active: flow_control.holder_wait, how long a request whose session's worker is full waits for it (virtual time) before any worker may take it; as a request ends, the heads of the held queues (the general one and each worker's) are tried oldest first; 0: held requests take the first worker that frees")
	fs.BoolVar(&o.holdOnSaturation, "hold-on-saturation", false, "play flow_control.hold_on_saturation: every policy's requests are held while every engine is saturated (more than 5 waiting or 80 % of its KV cache in use, as read at -scrape-interval), first come first served, and routed as a pass ends and one is not. One replica, no prefill workers")
	fs.BoolVar(&o.unseenRequests, "unseen-requests", false, "play engine_metrics.unseen_requests (on in the server): each scrape (-scrape-interval; without one, each decision) counts the requests an engine holds beyond the bookings in its N(w); off by default so that the recorded tables stay as measured")
	fs.Float64Var(&o.bypassShare, "bypass-share", 0, "share of sessions (of requests, without sessions) that reach the workers past kvroute, round-robin, as direct clients or a second gateway; their requests are left out of the results")
	fs.BoolVar(&o.noEngineAdapters, "no-engine-adapters", false, "leave the engines' running and waiting LoRA adapters out of the cost (kvroute before 2026-12-05): it sees only the adapters its replicas booked")
	fs.IntVar(&o.dpRanks, "dp-ranks", 1, "data-parallel ranks per worker: each worker is a server of this many ranks behind one address (vLLM --data-parallel-size), each rank an engine of the per-worker flags (-num-gpu-blocks, -max-num-seqs, … describe one rank)")
	fs.StringVar(&o.dpRouting, "dp-routing", "blind", "with -dp-ranks: blind (the router sees each server as one worker of its ranks' summed capacity and slots, and the engine's balancer picks the rank: fewest waiting+running, ties to the lowest) or rank (every rank a worker of its own, as a rank header would let the router pick it)")
	fs.StringVar(&o.logDir, "log-dir", "", "write each run's request log (JSON lines: requests, passes, evictions) to DIR/<policy>.seed<N>.jsonl")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.workload == "shared-prefix" {
		o.sessions = sessionsFlagsOver(fs, replay.DefaultSharedPrefix(), o.sessions)
	}
	o.traceCfg.Jitter = time.Duration(o.jitterMs) * time.Millisecond
	results, err := execute(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "replay: %v\n", err)
		return 1
	}
	if o.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return 1
		}
		return 0
	}
	printTable(stdout, results)
	printSummary(stdout, replay.Summarize(results, o.baseline), o.baseline)
	return 0
}

func execute(o options, stderr io.Writer) ([]replay.Result, error) {
	engine := sim.Config{BlockSize: o.blockSize, NumGPUBlocks: o.numGPUBlocks, MaxNumSeqs: o.maxNumSeqs, MaxBatchedTokens: o.batched, MaxLoRAs: o.maxLoRAs,
		HostBlocks: o.hostBlocks, HostChunkBlocks: o.hostChunkBlocks}
	events := kvevents.DefaultConfig()
	events.Tiers, events.OffloadTiers = splitList(o.tiers), splitList(o.offloadTiers)
	if err := events.Validate(); err != nil {
		return nil, fmt.Errorf("-tiers, -offload-tiers: %w", err)
	}
	var traceData []byte
	switch o.workload {
	case "compacting":
		def := replay.DefaultCompacting()
		o.sessions.CompactEvery, o.sessions.SummaryTokens = or(o.sessions.CompactEvery, def.CompactEvery), or(o.sessions.SummaryTokens, def.SummaryTokens)
		fallthrough
	case "sessions":
		o.workers = or(o.workers, 2)
		engine.NumGPUBlocks, engine.MaxNumSeqs = or(engine.NumGPUBlocks, 512), or(engine.MaxNumSeqs, 8)
	case "shared-prefix":
		o.workers = or(o.workers, 4)
		engine.NumGPUBlocks, engine.MaxNumSeqs = or(engine.NumGPUBlocks, 16384), or(engine.MaxNumSeqs, 4)
	case "mooncake":
		if o.trace == "" {
			return nil, fmt.Errorf("-trace is required for the mooncake workload")
		}
		var err error
		if traceData, err = os.ReadFile(o.trace); err != nil {
			return nil, err
		}
		o.workers = or(o.workers, 8)
		engine.NumGPUBlocks, engine.MaxNumSeqs = or(engine.NumGPUBlocks, 16384), or(engine.MaxNumSeqs, 256)
	default:
		return nil, fmt.Errorf("-workload: unknown %q (sessions, compacting, shared-prefix, mooncake)", o.workload)
	}
	if o.sessions.CompactEvery < 0 || o.sessions.SummaryTokens < 0 {
		return nil, fmt.Errorf("-compact-every and -summary-tokens: must be ≥ 0")
	}
	if o.workload == "mooncake" && o.sessions.Adapters > 0 {
		return nil, fmt.Errorf("-lora-adapters: only for the sessions workloads")
	}
	if o.workload != "mooncake" {
		if err := o.sessions.Validate(); err != nil {
			return nil, fmt.Errorf("-%w", err)
		}
	}
	if o.format != "table" && o.format != "json" {
		return nil, fmt.Errorf("-format: must be table or json, got %q", o.format)
	}
	if o.dpRanks < 1 {
		return nil, fmt.Errorf("-dp-ranks: must be ≥ 1, got %d", o.dpRanks)
	}
	if o.dpRouting != "blind" && o.dpRouting != "rank" {
		return nil, fmt.Errorf("-dp-routing: must be blind or rank, got %q", o.dpRouting)
	}
	if err := engine.Validate(); err != nil {
		return nil, err
	}
	seeds, err := parseSeeds(o.seeds)
	if err != nil {
		return nil, err
	}
	policies := splitPolicies(o.policies)
	for _, p := range policies { // fail fast on a bad policy
		if _, err := replay.NewPicker(p, nil); err != nil {
			return nil, err
		}
	}
	type job struct {
		i      int
		policy string
		seed   uint64
	}
	var jobs []job
	for _, p := range policies {
		for _, s := range seeds {
			jobs = append(jobs, job{len(jobs), p, s})
		}
	}
	results := make([]replay.Result, len(jobs))
	errs := make([]error, len(jobs))
	runDone := newProgress(stderr, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(o.parallel, 1))
	for _, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			var w replay.Workload
			if o.workload != "mooncake" {
				w = replay.NewSessions(o.sessions, j.seed)
			} else if w, errs[j.i] = replay.NewTrace(bytes.NewReader(traceData), o.traceCfg, j.seed); errs[j.i] != nil {
				return
			}
			cfg := replay.Config{
				Workers: o.workers, PrefillWorkers: o.prefillWorkers, Engine: engine, Policy: j.policy, Seed: j.seed, IndexSource: o.indexSource,
				IndexTTL: o.indexTTL, PendingTTL: o.pendingTTL, ApproximateOffload: o.approximateOffload, Model: "replay-model", SessionHeader: o.sessionHeader, HideMaxNumSeqs: !o.routerMaxNumSeqs,
				KVEvents: &events,
				Replicas: o.replicas, SharedBookings: o.sharedBookings, ShareInterval: o.shareInterval, ShareBlocks: o.shareBlocks, ScrapeInterval: o.scrapeInterval, NoEngineAdapters: o.noEngineAdapters, BypassShare: o.bypassShare, UnseenRequests: o.unseenRequests, MaxActive: o.maxActive, HolderWait: o.holderWait, HoldOnSaturation: o.holdOnSaturation,
				DPRanks: o.dpRanks, DPRankRouting: o.dpRouting == "rank",
			}
			if o.workload != "mooncake" {
				cfg.LoRAAdapters = replay.AdapterNames(o.sessions.Adapters)
			}
			var logFile *os.File
			if o.logDir != "" {
				if logFile, errs[j.i] = os.Create(filepath.Join(o.logDir, logName(j.policy, j.seed))); errs[j.i] != nil {
					return
				}
				buf := bufio.NewWriter(logFile)
				cfg.Log = buf
				defer func() {
					if err := buf.Flush(); err != nil && errs[j.i] == nil {
						errs[j.i] = err
					}
					if err := logFile.Close(); err != nil && errs[j.i] == nil {
						errs[j.i] = err
					}
				}()
			}
			results[j.i], errs[j.i] = replay.Run(cfg, w)
			runDone()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// logName is a run's request log file name: the policy with characters that are
// awkward in file names replaced, and the seed.
func logName(policy string, seed uint64) string {
	safe := strings.Map(func(r rune) rune {
		if r == '/' || r == ':' || r == ',' || r == '=' || r == ' ' {
			return '_'
		}
		return r
	}, policy)
	return fmt.Sprintf("%s.seed%d.jsonl", safe, seed)
}

// splitPolicies splits on commas, keeping "kv:a=1,b=2" together: an item with "=" but
// no ":" continues the previous policy's overrides.
func splitPolicies(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if strings.Contains(item, "=") && !strings.Contains(item, ":") && len(out) > 0 {
			out[len(out)-1] += "," + item
			continue
		}
		out = append(out, item)
	}
	return out
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// maxSeeds bounds a -seeds range, so a typo such as 1-1000000000 fails instead of
// queueing runs for days.
const maxSeeds = 10_000

// parseSeeds parses "1,2,5-8" into its seeds, in order.
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		first, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-seeds: %q is not a seed or a range of seeds", f)
		}
		last := first
		if isRange {
			if last, err = strconv.ParseUint(hi, 10, 64); err != nil || last < first {
				return nil, fmt.Errorf("-seeds: %q is not a range of seeds (first-last, first ≤ last)", f)
			}
		}
		if last-first >= maxSeeds || len(out)+int(last-first+1) > maxSeeds {
			return nil, fmt.Errorf("-seeds: more than %d seeds", maxSeeds)
		}
		for v := first; ; v++ {
			out = append(out, v)
			if v == last {
				break
			}
		}
	}
	return out, nil
}

// sessionsFlagsOver returns def with the session flags given on the command line taken
// from flags: a workload's own defaults, under the user's choices.
func sessionsFlagsOver(fs *flag.FlagSet, def, flags replay.SessionsConfig) replay.SessionsConfig {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sessions":
			def.Sessions = flags.Sessions
		case "turns":
			def.Turns = flags.Turns
		case "shared-prefix-tokens":
			def.SharedPrefixTokens = flags.SharedPrefixTokens
		case "prefix-tokens":
			def.PrefixTokens = flags.PrefixTokens
		case "user-tokens":
			def.UserTokens = flags.UserTokens
		case "output-tokens":
			def.OutputTokens = flags.OutputTokens
		case "start-spread":
			def.StartSpread = flags.StartSpread
		case "think-min":
			def.ThinkMin = flags.ThinkMin
		case "think-max":
			def.ThinkMax = flags.ThinkMax
		case "lora-adapters":
			def.Adapters = flags.Adapters
		}
	})
	return def
}

func or(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// newProgress returns a function that each finished run calls: it counts the run and
// reports the count on w. Runs finish on several goroutines, so counting and writing
// happen under one lock.
func newProgress(w io.Writer, total int) func() {
	start := time.Now()
	var mu sync.Mutex
	done := 0
	return func() {
		mu.Lock()
		defer mu.Unlock()
		done++
		fmt.Fprintf(w, "\rreplay: %d/%d runs done (%s)", done, total, time.Since(start).Round(time.Second))
		if done == total {
			fmt.Fprintln(w)
		}
	}
}

// printSummary prints one line per policy over its seeds: moved turns' range, mean
// recompute and hit ratio, and per-seed ratios to the baseline (mean and worst) of
// recompute, resumed-turn p95 TTFT, makespan and the TTFT p50 and p95 of all requests.
func printSummary(w io.Writer, summaries []replay.Summary, baseline string) {
	fmt.Fprintf(w, "\nover seeds; × %s is per seed, then mean / worst:\n", baseline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tseeds\tmoved\trecomputed mean\thit ratio\trecomputed × base\tresumed p95 × base\tmakespan × base\tTTFT p50 × base\tTTFT p95 × base\t")
	ratio := func(r replay.Ratio) string {
		if r == (replay.Ratio{}) {
			return "-"
		}
		return fmt.Sprintf("%.3f / %.3f", r.Mean, r.Worst)
	}
	for _, s := range summaries {
		fmt.Fprintf(tw, "%s\t%d\t%d–%d\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t\n", s.Policy, s.Seeds, s.MovedMin, s.MovedMax,
			s.RecomputedMean, s.HitRatioMean, ratio(s.Recomputed), ratio(s.ResumedP95), ratio(s.Makespan), ratio(s.TTFTP50), ratio(s.TTFTP95))
	}
	tw.Flush()
}

func printTable(w io.Writer, results []replay.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// Runs with prefill workers add their split columns; others print as they always did.
	split := slices.ContainsFunc(results, func(r replay.Result) bool { return r.SplitRequests > 0 })
	header := "policy\tseed\trequests\tmoved\trecomputed\thit ratio\tnon-max\tTTFT p50 ms\tTTFT p95 ms\tresumed p95 ms\te2e p95 ms\tmakespan s\tmax/mean prefill\tov match\t"
	if split {
		header += "split\ttransferred\t"
	}
	// Likewise runs whose engines loaded prompts from a host tier (-host-blocks).
	host := slices.ContainsFunc(results, func(r replay.Result) bool { return r.HostLoadedTokens > 0 })
	if host {
		header += "host loaded\t"
	}
	// And runs with flow control (-max-active) that held requests.
	held := slices.ContainsFunc(results, func(r replay.Result) bool { return r.HeldRequests > 0 })
	if held {
		header += "held\theld wait p95 ms\t"
	}
	fmt.Fprintln(tw, header)
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%d\t%.3f\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.3f\t",
			r.Policy, r.Seed, r.Requests, r.MovedTurns, r.ResumedTurns, r.RecomputedPrefillTokens, r.CacheHitRatio,
			r.NonMaxOverlapSelections, r.TTFTP50ms, r.TTFTP95ms, r.ResumedTTFTP95ms, r.E2EP95ms, r.MakespanS, r.MaxMeanPrefillLoadRatio, r.OverlapMatchRatio)
		if split {
			fmt.Fprintf(tw, "%d\t%d\t", r.SplitRequests, r.TransferredTokens)
		}
		if host {
			fmt.Fprintf(tw, "%d\t", r.HostLoadedTokens)
		}
		if held {
			fmt.Fprintf(tw, "%d\t%.0f\t", r.HeldRequests, r.HeldWaitP95ms)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
