// Command loadtest puts kvroute under sustained load on loopback and reports what the
// server path costs: N concurrent streaming chats of growing multi-turn sessions
// (chat completions, or with -api the same sessions as Anthropic Messages or OpenAI
// Responses bodies, which kvroute routes on the chat vLLM renders for them, or as RL
// episodes of token ids on vLLM's token-in /inference/v1/generate or SGLang's native
// /generate) go through
// the envoytest data plane to simulated workers (package mockworker, run in this
// process), routed by the real extproc binary (bin/extproc, run as a child with
// its own config, so its memory and CPU are measured alone) for the given duration.
//
//	make build && bin/loadtest -streams 1000 -duration 10m
//
// It prints a sample line every -sample interval (kvroute's RSS, heap, goroutines, GC
// and CPU, the load's throughput) and a report at the end: throughput, the ext_proc
// round trip timed in the data plane around each of kvroute's replies, kvroute's own
// decision-stage histogram, allocations per request, errors by class and the booking
// gauges left once every stream has ended. It exits 1 on any error, a leaked booking or
// kvroute dying; timing goals are reported, not enforced.
//
// With -hostile-streams and -hostile-kind, a hostile client sends bodies built to cost
// a router (hostile.go) beside the load, on connections of its own; their outcomes are
// reported apart, and kvroute's peak RSS and CPU time are read from /proc.
//
// With -tenants (a:14,b:2), the streams belong to tenants named in the fairness header
// (tenants.go): a 429 is retried after its retry-after as the OpenAI SDKs retry it,
// and each tenant's figures are reported apart, with flow control's when kvroute runs
// it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"
)

// options are the command's flags.
type options struct {
	bin           string
	kvrouteConfig string // a base kvroute YAML; empty: every default
	streams       int
	duration      time.Duration
	warmup        time.Duration
	sample        time.Duration
	drain         time.Duration
	workers       int
	speed         float64
	maxNumSeqs    int
	perEvent      int // tokens per SSE event after the first
	msgTimeout    time.Duration
	pprofDir      string
	jsonPath      string
	replicas      int    // kvroute processes, each behind its own data plane
	peers         bool   // the replicas exchange booked load (peers.addresses)
	selfProfile   string // this process's CPU profile: the harness's own cost
	load          workload
	// hostileStreams of each of hostileKinds send hostileBytes bodies from the warm-up's
	// end, each stream at most one every hostileEvery (0: back to back; hostile.go);
	// procEvery is the /proc sampling interval.
	hostileStreams int
	hostileKinds   []hostileKind
	hostileBytes   int
	hostileEvery   time.Duration
	procEvery      time.Duration
}

func defaultOptions() options {
	return options{
		bin: binDir(), replicas: 1, streams: 200, duration: 2 * time.Minute, warmup: 20 * time.Second, sample: 10 * time.Second,
		drain: time.Minute, workers: 4, speed: 20, perEvent: 1, msgTimeout: 2 * time.Second,
		hostileBytes: 4 << 20, procEvery: 100 * time.Millisecond,
		load: workload{model: "mock", api: apiChat, prefixTokens: 2000, userTokens: 128, maxPromptTokens: 4000, outputTokens: 64,
			samples: 1, seed: 1, requestTimeout: time.Minute, errorPause: 100 * time.Millisecond},
	}
}

// binDir is the directory of this binary: `make build` puts extproc beside it.
func binDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	return filepath.Dir(exe)
}

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

func cli(args []string, stdout, stderr io.Writer) int {
	o := defaultOptions()
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", o.bin, "directory holding the extproc binary (make build)")
	fs.StringVar(&o.kvrouteConfig, "kvroute-config", "", "base kvroute YAML (tokenizer, policy, …); listeners and workers are set by the load test")
	fs.IntVar(&o.streams, "streams", o.streams, "concurrent streaming chats (1-20000)")
	fs.DurationVar(&o.duration, "duration", o.duration, "whole run, warm-up included (at most 24h)")
	fs.DurationVar(&o.warmup, "warmup", o.warmup, "first part of the run left out of the latency, throughput and RSS figures")
	fs.DurationVar(&o.sample, "sample", o.sample, "interval between samples of kvroute's RSS, goroutines, GC and CPU")
	fs.DurationVar(&o.drain, "drain", o.drain, "at the end, how long requests in flight may take to finish")
	fs.IntVar(&o.workers, "workers", o.workers, "simulated workers (1-64)")
	fs.Float64Var(&o.speed, "speed", o.speed, "workers run this many times faster than the pass-time model of a GPU")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 0, "requests a worker runs at once (0: enough for every stream, so workers never queue)")
	fs.IntVar(&o.perEvent, "tokens-per-event", 1, "workers stream the tokens after the first in SSE events of this many (1: one per token, as vLLM; each event is an ext_proc message)")
	fs.DurationVar(&o.msgTimeout, "message-timeout", o.msgTimeout, "the data plane's ext_proc message_timeout (examples/envoy.yaml: 2s); past it the request fails with 504")
	api := fs.String("api", string(apiChat), "the API the sessions are sent in: chat (/v1/chat/completions), messages (Anthropic's /v1/messages, system prompt top-level), responses (/v1/responses: instructions and input, store false, the whole conversation resent), generate (vLLM's token-in /inference/v1/generate: RL episodes whose token_ids grow by the output ids and new ones each turn) or sglang (the same episodes as SGLang's native /generate input_ids, no model: kvroute gets default_model, the workers' model, unless -kvroute-config sets it) or sglang-session (those episodes as SGLang sessions: POST /open_session, each turn a /generate of the new ids alone naming the session in session_params, continuing the last answer's meta_info.id, then POST /close_session; turns aborted for a session the engine does not hold are errors of class session_aborted)")
	fs.IntVar(&o.load.prefixTokens, "prefix-tokens", o.load.prefixTokens, "tokens of each session's system prompt")
	fs.BoolVar(&o.load.sharedPrefix, "shared-prefix", false, "every session opens with the same system prompt (one product's prompt across the fleet)")
	fs.IntVar(&o.load.userTokens, "user-tokens", o.load.userTokens, "new user tokens per turn")
	fs.IntVar(&o.load.maxPromptTokens, "max-prompt-tokens", o.load.maxPromptTokens, "a session ends before its prompt passes this; the stream starts a new one")
	fs.IntVar(&o.load.outputTokens, "output-tokens", o.load.outputTokens, "output tokens per request (max_tokens)")
	fs.IntVar(&o.load.samples, "samples", o.load.samples, "with -api generate: parallel samples per request (sampling_params.n, a GRPO group), each a batch slot on the worker; the episode goes on from choice 0's output, and the figures stay per HTTP request (TTFT: the first sample's first token; prompt and cached tokens counted once)")
	fs.DurationVar(&o.load.think, "think", 0, "pause between a session's turns")
	fs.Uint64Var(&o.load.seed, "seed", o.load.seed, "workload seed")
	fs.StringVar(&o.pprofDir, "pprof-dir", "", "save kvroute's CPU profile (30 s after the warm-up) and allocs/heap profiles (at the end) here; turns admin_pprof on")
	fs.IntVar(&o.replicas, "replicas", o.replicas, "kvroute processes (1-8), each behind its own data plane; streams are spread over them")
	fs.BoolVar(&o.peers, "peers", false, "with -replicas: the replicas exchange their booked load (peers.addresses: each other's admin ports)")
	fs.StringVar(&o.jsonPath, "json", "", "also write the report as JSON to this file (durations in nanoseconds)")
	fs.StringVar(&o.selfProfile, "self-cpuprofile", "", "write the load test's own CPU profile (client, data plane, workers) to this file")
	fs.IntVar(&o.hostileStreams, "hostile-streams", 0, "from the warm-up's end, this many streams of each -hostile-kind send hostile requests back to back on connections of their own, counted apart (0-64)")
	kinds := fs.String("hostile-kind", "", "hostile requests' kinds, comma-separated: "+kindList()+" (the first three a completions prompt, tiny-json a chat of [0,0,…])")
	fs.IntVar(&o.hostileBytes, "hostile-bytes", o.hostileBytes, "size of each hostile body (at most kvroute's max_body_bytes and the data plane's 4 MiB buffer)")
	fs.DurationVar(&o.hostileEvery, "hostile-interval", 0, "each hostile stream starts a request at most once per this interval (0: back to back, as fast as kvroute answers)")
	fs.DurationVar(&o.procEvery, "proc-sample", o.procEvery, "interval between reads of kvroute's /proc status and stat (peak RSS, CPU time)")
	tenants := fs.String("tenants", "", "streams by tenant, instead of -streams: name:streams,… (e.g. a:15,b:1); each request names its tenant in the fairness header (flow_control.fairness_header, default x-llm-d-inference-fairness-id), a 429 is retried after its retry-after and counted, and the report gives each tenant's figures")
	mix := fs.String("samples-mix", "", "with -api generate, streams by parallel samples a request, instead of -streams and -samples: samples:streams,… (e.g. 1:12,16:4: 12 streams of single samples beside 4 of GRPO groups of 16); each at most -max-num-seqs; the report gives each class's figures")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.load.samplesMix, err = parseSamplesMix(*mix); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 2
	}
	if o.load.samplesMix != nil {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		switch {
		case set["streams"] || set["samples"]:
			fmt.Fprintln(stderr, "loadtest: -samples-mix: give it without -streams and -samples (the mix's classes are both)")
			return 2
		case *tenants != "":
			fmt.Fprintln(stderr, "loadtest: -samples-mix and -tenants: give one (each numbers the streams)")
			return 2
		}
		o.streams = groupStreams(o.load.samplesMix)
	}
	if o.load.tenants, err = parseTenants(*tenants); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 2
	}
	if o.load.tenants != nil {
		streamsSet := false
		fs.Visit(func(f *flag.Flag) { streamsSet = streamsSet || f.Name == "streams" })
		if streamsSet {
			fmt.Fprintln(stderr, "loadtest: -streams and -tenants: give one (with -tenants the streams are the tenants')")
			return 2
		}
		o.streams = groupStreams(o.load.tenants)
	}
	if o.load.api, err = parseBodyAPI(*api); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 2
	}
	if o.hostileKinds, err = parseHostileKinds(*kinds); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if o.selfProfile != "" {
		f, err := os.Create(o.selfProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "loadtest: -self-cpuprofile:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rep, err := run(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return 1
	}
	rep.print(stdout)
	if o.jsonPath != "" {
		if err := rep.writeJSON(o.jsonPath); err != nil {
			fmt.Fprintln(stderr, "loadtest:", err)
			return 1
		}
	}
	if problems := rep.failures(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "loadtest: FAIL:", p)
		}
		return 1
	}
	return 0
}

// maxSamples bounds -samples: a GRPO group is 8 or 16 samples, and kvroute counts
// at most openai.MaxSequences.
const maxSamples = 256

func (o options) validate() error {
	l := o.load
	switch {
	case o.streams < 1 || o.streams > 20000:
		return errors.New("-streams: must be 1-20000")
	case o.duration <= 0 || o.duration > 24*time.Hour:
		return errors.New("-duration: must be > 0 and at most 24h")
	case o.warmup < 0 || o.warmup >= o.duration:
		return errors.New("-warmup: must be ≥ 0 and shorter than -duration")
	case o.sample <= 0:
		return errors.New("-sample: must be > 0")
	case o.drain <= 0:
		return errors.New("-drain: must be > 0")
	case o.workers < 1 || o.workers > 64:
		return errors.New("-workers: must be 1-64")
	case o.speed <= 0:
		return errors.New("-speed: must be > 0")
	case o.replicas < 1 || o.replicas > 8:
		return errors.New("-replicas: must be 1-8")
	case o.peers && o.replicas < 2:
		return errors.New("-peers: needs -replicas 2 or more")
	case o.maxNumSeqs < 0:
		return errors.New("-max-num-seqs: must be ≥ 0")
	case o.msgTimeout <= 0:
		return errors.New("-message-timeout: must be > 0")
	case o.perEvent < 1:
		return errors.New("-tokens-per-event: must be ≥ 1")
	case !slices.Contains(bodyAPIs, l.api):
		return fmt.Errorf("-api: unknown API %q (want %s)", l.api, bodyAPINames())
	case l.prefixTokens < 1 || l.userTokens < 1 || l.outputTokens < 1:
		return errors.New("-prefix-tokens, -user-tokens and -output-tokens: must be ≥ 1")
	case l.maxPromptTokens < l.prefixTokens+l.userTokens:
		return errors.New("-max-prompt-tokens: must leave room for the prefix and one user turn")
	case l.think < 0:
		return errors.New("-think: must be ≥ 0")
	case l.samples < 1 || l.samples > maxSamples:
		return fmt.Errorf("-samples: must be 1-%d", maxSamples)
	case l.samples > 1 && l.api != apiGenerate:
		return errors.New("-samples: only with -api generate (sampling_params.n)")
	case o.maxNumSeqs > 0 && l.samples > o.maxNumSeqs:
		return errors.New("-samples: must be at most -max-num-seqs (vLLM refuses n above max_num_seqs)")
	case l.samplesMix != nil && l.api != apiGenerate:
		return errors.New("-samples-mix: only with -api generate (sampling_params.n)")
	case l.samplesMix != nil && l.samples != 1:
		return errors.New("-samples-mix: give it without -samples")
	case l.samplesMix != nil && o.maxNumSeqs > 0 && slices.MaxFunc(l.samplesMix, func(a, b sampleClass) int { return a.key - b.key }).key > o.maxNumSeqs:
		return errors.New("-samples-mix: each class's samples must be at most -max-num-seqs (vLLM refuses n above max_num_seqs)")
	case l.samplesMix != nil && groupStreams(l.samplesMix) != o.streams:
		return fmt.Errorf("-samples-mix: its %d streams are not -streams' %d", groupStreams(l.samplesMix), o.streams)
	case o.hostileStreams < 0 || o.hostileStreams > 64:
		return errors.New("-hostile-streams: must be 0-64")
	case o.hostileStreams > 0 && len(o.hostileKinds) == 0:
		return errors.New("-hostile-streams: needs -hostile-kind")
	case o.hostileStreams == 0 && len(o.hostileKinds) > 0:
		return errors.New("-hostile-kind: needs -hostile-streams 1 or more")
	case o.hostileBytes < minHostileBytes || o.hostileBytes > dataPlaneBuffer:
		return fmt.Errorf("-hostile-bytes: must be %d-%d (the data plane's buffer; past it Envoy answers 413 itself)", minHostileBytes, dataPlaneBuffer)
	case o.hostileEvery < 0:
		return errors.New("-hostile-interval: must be ≥ 0")
	case o.procEvery <= 0:
		return errors.New("-proc-sample: must be > 0")
	case l.tenants != nil && groupStreams(l.tenants) != o.streams:
		return fmt.Errorf("-tenants: their %d streams are not -streams' %d", groupStreams(l.tenants), o.streams)
	}
	return nil
}
