// Command demo shows what kvroute is for, on loopback, in under a minute: it starts
// simulated vLLM workers (bin/mockworker) and kvroute (bin/extproc) as processes, puts
// the envoytest data plane in front, drives resumed multi-turn sessions (Workload A,
// shortened) through the OpenAI Go client, and compares kvroute's shipped policy with
// Dynamo's default cost (kv): moved turns, cache hit ratio and TTFT. The workers publish
// their KV cache events over ZMQ as vLLM does, and kvroute's index is fed by them (event
// mode). It stops everything it started. Run it with `make demo`.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/internal/child"
	"github.com/kvroute/kvroute/internal/onetoken"
	"github.com/kvroute/kvroute/replay"
)

type options struct {
	bin                      string
	workers, sessions, turns int
	prefixWords, userWords   int
	outputTokens             int
	speed                    float64
	seed                     uint64
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the extproc and mockworker binaries")
	flag.IntVar(&o.workers, "workers", 2, "simulated workers (1-8)")
	flag.IntVar(&o.sessions, "sessions", 16, "concurrent sessions")
	flag.IntVar(&o.turns, "turns", 8, "turns per session")
	flag.IntVar(&o.prefixWords, "prefix-tokens", 3000, "tokens of each session's stable system prompt")
	flag.IntVar(&o.userWords, "user-tokens", 96, "new user tokens per turn")
	flag.IntVar(&o.outputTokens, "output-tokens", 32, "output tokens per turn")
	flag.Float64Var(&o.speed, "speed", 4, "workers run this many times faster than real GPUs; think times shrink alike")
	flag.Uint64Var(&o.seed, "seed", 1, "workload seed")
	flag.Parse()
	if o.workers < 1 || o.workers > 8 {
		fmt.Fprintln(os.Stderr, "demo: -workers must be 1-8")
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "kvroute demo: %d simulated workers (512 KV blocks of 64 tokens, 8 seqs each, ×%g speed, KV events over ZMQ), %d sessions × %d turns, %d-token prefixes\n",
		o.workers, o.speed, o.sessions, o.turns, o.prefixWords)
	var results []result
	for _, p := range []struct{ label, yaml string }{
		{"kvroute (shipped default)", ""},
		{"kv (Dynamo default cost)", "policy: {prefix_affinity_weight: 0, cache_pressure_weight: 0}\n"},
	} {
		r, err := runPolicy(o, p.label, p.yaml)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tmoved turns\tcache hit ratio\tTTFT p50 ms\tTTFT p95 ms\tresumed-turn TTFT p95 ms\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d/%d\t%.3f\t%.0f\t%.0f\t%.0f\t\n", r.label, r.moved, r.resumed, r.hitRatio, r.p50, r.p95, r.resumedP95)
	}
	tw.Flush()
	fmt.Println("(TTFT is wall-clock through envoytest and kvroute, with workers at ×" + fmt.Sprint(o.speed) + " speed.)")
	for _, r := range results {
		fmt.Printf("%s: index fed by KV events from %d/%d workers (%.0f BlockStored events applied)\n", r.label, r.eventWorkers, o.workers, r.storedEvents)
	}
}

type result struct {
	label                      string
	eventWorkers               int     // workers kvroute's index follows from their KV events at the end
	storedEvents               float64 // BlockStored events applied
	moved, resumed             int
	hitRatio, p50, p95         float64
	resumedP95                 float64
	promptTokens, cachedTokens int64
	ttft, resumedTTFT          []time.Duration
}

func runPolicy(o options, label, policyYAML string) (result, error) {
	res := result{label: label}
	var procs []*child.Process
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	var workersYAML strings.Builder
	for i := range o.workers {
		p, line, err := child.Start(filepath.Join(o.bin, "mockworker"), []string{
			"-listen", "127.0.0.1:0", "-name", fmt.Sprint("w", i), "-speed", fmt.Sprint(o.speed),
			"-num-gpu-blocks", "512", "-max-num-seqs", "8", "-block-size", "64", "-seed", fmt.Sprint(i + 1),
			"-kv-events-endpoint", "tcp://127.0.0.1:0", "-kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		}, "listening on ")
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
		addr := strings.TrimPrefix(line, "listening on ")
		var events, replay string
		for _, l := range p.Tail() {
			if rest, ok := strings.CutPrefix(l, "kv events on "); ok {
				events, replay, _ = strings.Cut(rest, " replay ")
			}
		}
		if events == "" {
			return res, fmt.Errorf("mockworker w%d did not say where it publishes its KV events", i)
		}
		fmt.Fprintf(&workersYAML, "  - {name: w%d, address: %q, capacity_blocks: 512, models: [demo], kv_events: {endpoint: %q, replay_endpoint: %q}}\n",
			i, addr, events, replay)
	}
	dir, err := os.MkdirTemp("", "kvroute-demo")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	cfg := "grpc_address: 127.0.0.1:0\nadmin_address: 127.0.0.1:0\nlog_level: info\nblock_size: 64\nworkers:\n" + workersYAML.String() + policyYAML
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return res, err
	}
	p, line, err := child.Start(filepath.Join(o.bin, "extproc"), []string{"-config", cfgPath}, "kvroute serving")
	if err != nil {
		return res, err
	}
	procs = append(procs, p)
	var serving struct {
		GRPC  string `json:"grpc"`
		Admin string `json:"admin"`
	}
	if err := json.Unmarshal([]byte(line), &serving); err != nil || serving.GRPC == "" {
		return res, fmt.Errorf("extproc: cannot read its address from %q", line)
	}
	envoy := envoytest.NewServer(envoytest.Config{
		ProcessorAddress: serving.GRPC, SendProtocolConfig: true, MessageTimeout: 10 * time.Second,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
	})
	defer envoy.Close()

	fmt.Fprintf(os.Stderr, "%s:\n", label)
	err = drive(context.Background(), o, envoy.URL, &res)
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return res, err
	}
	if res.promptTokens > 0 {
		res.hitRatio = float64(res.cachedTokens) / float64(res.promptTokens)
	}
	if res.eventWorkers, res.storedEvents, err = eventsState(serving.Admin); err != nil {
		return res, err
	}
	res.p50, res.p95, res.resumedP95 = replay.Percentile(res.ttft, 50), replay.Percentile(res.ttft, 95), replay.Percentile(res.resumedTTFT, 95)
	return res, nil
}

// eventsState reads kvroute's /metrics: how many workers are in event mode, and how
// many BlockStored events it applied.
func eventsState(admin string) (workers int, stored float64, err error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, 0, fmt.Errorf("kvroute metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "kvroute_kvevents_worker_mode{") && strings.Contains(line, `mode="events"`) && strings.HasSuffix(line, " 1"):
			workers++
		case strings.HasPrefix(line, `kvroute_kvevents_events_total{outcome="applied",type="BlockStored"}`):
			fields := strings.Fields(line)
			stored, _ = strconv.ParseFloat(fields[len(fields)-1], 64)
		}
	}
	return workers, stored, sc.Err()
}

// words returns n words of one token each (package onetoken: one token in kvroute's
// embedded default tokenizer, which the demo runs with, and in the approximate one).
func words(rng *rand.Rand, n int) string {
	vocabulary := onetoken.Words()
	var b strings.Builder
	for range n {
		b.WriteByte(' ')
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
	}
	return b.String()
}

// progressBar draws done/total on stderr.
func progressBar(done, total int) {
	const width = 40
	filled := done * width / total
	fmt.Fprintf(os.Stderr, "\r  [%s%s] %d/%d turns", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total)
}
