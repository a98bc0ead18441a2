// Command mockworker serves a simulated vLLM-like engine in real time behind an
// OpenAI-compatible API, on loopback by default. Its first line on stdout is
// "listening on ADDR"; with -kv-events-endpoint it publishes the engine's KV cache
// events over ZMQ in vLLM's wire format and prints "kv events on ENDPOINT replay
// ENDPOINT" first.
//
// Prompts are tokenized as kvroute tokenizes them: with the tokenizers section of the
// kvroute config given with -kvroute-config, with one tokenizer given with -tokenizer,
// or else with kvroute's embedded default. The worker also serves vLLM's render
// endpoints (/v1/chat/completions/render, /v1/completions/render, /v1/responses/render,
// /v1/messages/render) for kvroute's engine mode; with -api-key they want it, as vLLM
// started with --api-key does. vLLM's token-in/token-out /inference/v1/generate takes
// the prompt as token ids, and SGLang's native /generate as text or input_ids, with
// SGLang's sessions (/open_session, /close_session, session_params).
//
// For disaggregated prefill/decode, any worker serves prefills for a remote decode
// (kv_transfer_params.do_remote_decode) and decodes whose KV a prefill worker computed
// (kv_transfer_params.do_remote_prefill). With -pd-sidecar it also plays llm-d's routing
// sidecar: a request whose x-prefiller-host-port header names a prefill worker is
// prefilled there, then decoded here, and its answer's x-prefilled-by names the
// prefill worker.
//
// With -data-parallel-size N the worker runs N engines (ranks) behind its one address,
// as vLLM's internal load balancer does: the X-data-parallel-rank header pins a request's
// rank on chat, completions, /inference/v1/generate and /v1/messages (a rank out of
// range gets vLLM's 400, a value that is not an integer is ignored), else the rank with
// the fewest waiting and running requests serves it; the answer's x-data-parallel-rank
// names the rank, /metrics has each rank's series labelled engine="R", and rank R
// publishes KV events on the endpoints' ports + R (a line "kv events of rank R on …" for
// each after the first).
//
// With -host-blocks the engine has a host (CPU) tier of that many blocks behind its
// device cache, as vLLM with CPU offloading (OffloadingConnector) or LMCache: the
// prompt blocks it holds are loaded rather than recomputed, and its stores and
// evictions are published with medium "CPU".
//
//	mockworker -listen 127.0.0.1:8001 -name w0 -speed 4
//	mockworker -listen 127.0.0.1:8002 -name d0 -pd-sidecar
//	mockworker -kv-events-endpoint tcp://127.0.0.1:5557 -kv-events-replay-endpoint tcp://127.0.0.1:5558
//	mockworker -kvroute-config kvroute.yaml
//	mockworker -num-gpu-blocks 2048 -host-blocks 16384 -kv-events-endpoint tcp://127.0.0.1:5557
//	mockworker -data-parallel-size 4 -kv-events-endpoint tcp://127.0.0.1:5557
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize/models"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run serves until ctx ends (SIGTERM, interrupt) and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancel(ctx) // ends the shutdown goroutine on any return
	defer cancel()
	fs := flag.NewFlagSet("mockworker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := sim.DefaultConfig()
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve on (loopback by default)")
	var cfg mockworker.Config
	fs.StringVar(&cfg.Name, "name", "mockworker", "name reported in the x-served-by header")
	fs.Float64Var(&cfg.Speed, "speed", 1, "run this many times faster than the pass-time model")
	fs.IntVar(&cfg.Engine.BlockSize, "block-size", def.BlockSize, "KV block size in tokens")
	fs.IntVar(&cfg.Engine.NumGPUBlocks, "num-gpu-blocks", def.NumGPUBlocks, "KV blocks")
	fs.IntVar(&cfg.Engine.MaxNumSeqs, "max-num-seqs", def.MaxNumSeqs, "running requests at most")
	fs.IntVar(&cfg.Engine.MaxBatchedTokens, "max-num-batched-tokens", def.MaxBatchedTokens, "token budget per pass")
	fs.IntVar(&cfg.Engine.MaxLoRAs, "max-loras", 0, "LoRA adapters running at once (vLLM --max-loras); 0: no limit")
	fs.IntVar(&cfg.Engine.HostBlocks, "host-blocks", 0, "KV blocks of a host (CPU) tier the device cache writes through to, as vLLM's CPU offloading: its hits are loaded, not recomputed, and its KV events have medium CPU; 0: none")
	fs.IntVar(&cfg.Engine.HostChunkBlocks, "host-chunk-blocks", 0, "the host tier holds chunks of this many blocks, as LMCache: each stored chunk an event with its tokens and block_size the chunk's length; 0: blocks, named by hash alone as vLLM's CPU offloading")
	fs.IntVar(&cfg.DefaultMaxTokens, "max-tokens", 16, "output tokens when a request names none")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 0, "context in tokens, as vLLM --max-model-len: listed in /v1/models, and a longer prompt, or one whose max_tokens it cannot hold beside it, gets vLLM's 400; 0: the KV cache's tokens")
	fs.IntVar(&cfg.TokensPerEvent, "tokens-per-event", 1, "stream tokens after the first in SSE events of this many")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the generated words")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", 1, "engines (data-parallel ranks) behind this one address, 1-64, as vLLM's internal load balancer: each has the KV blocks, max-num-seqs etc. given here; a request's X-data-parallel-rank header pins its rank on chat, completions, /inference/v1/generate and /v1/messages (out of range: 400), else the least loaded rank serves it; /metrics labels each rank's series engine=\"R\", rank R publishes KV events on the endpoints' ports + R")
	kvrouteConfig := fs.String("kvroute-config", "", "tokenize with the tokenizers section of this kvroute config (default: kvroute's embedded default)")
	tokenizer := fs.String("tokenizer", "", "tokenize every model with this tokenizer.json, or the directory holding it with tokenizer_config.json")
	fs.DurationVar(&cfg.RenderDelay, "render-delay", 0, "delay each answer of the render endpoints (a slow render server)")
	fs.StringVar(&cfg.RenderAPIKey, "api-key", "", "the render endpoints (only those) answer 401 without \"Authorization: Bearer KEY\", as vLLM --api-key does")
	fs.BoolVar(&cfg.PrefillSidecar, "pd-sidecar", false, "play llm-d's routing sidecar: prefill a request on the worker its x-prefiller-host-port header names, then decode it here with that KV")
	servedModels := fs.String("served-models", "", "serve only these base models, comma-separated, as vLLM's --served-model-name: /v1/models lists them and any other model (not an adapter) gets vLLM's 404 (default: any model)")
	loraAdapters := fs.String("lora-adapters", "", "serve these LoRA adapters, as name=base_model[,name=base_model…]: their blocks are cached apart and their KV events carry lora_name")
	var events kvevents.PublisherConfig
	var arrayForm, replayTopic bool
	fs.StringVar(&events.Endpoint, "kv-events-endpoint", "", "publish KV events on this ZMQ PUB endpoint (bound; port 0 picks one)")
	fs.StringVar(&events.ReplayEndpoint, "kv-events-replay-endpoint", "", "serve replays on this ZMQ ROUTER endpoint")
	fs.StringVar(&events.Topic, "kv-events-topic", "", "topic of every message (vLLM's default is empty)")
	fs.BoolVar(&arrayForm, "kv-events-array-form", false, "encode events as arrays, as engines before vLLM PR #42892 did (default: maps)")
	fs.BoolVar(&replayTopic, "kv-events-replay-topic", false, "replay replies carry the topic, as vLLM ≥ 0.26's do")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.DataParallelSize < 1 || cfg.DataParallelSize > mockworker.MaxDataParallelSize {
		fmt.Fprintf(stderr, "mockworker: -data-parallel-size: must be 1-%d, got %d\n", mockworker.MaxDataParallelSize, cfg.DataParallelSize)
		return 2
	}
	if events.Endpoint != "" {
		if arrayForm {
			events.Form = kvevents.FormArray
		}
		if replayTopic {
			events.ReplayLayout = kvevents.ReplayWithTopic
		}
		cfg.Events = &events
	}
	adapters, err := parseAdapters(*loraAdapters)
	if err != nil {
		fmt.Fprintln(stderr, "mockworker: -lora-adapters:", err)
		return 2
	}
	cfg.LoRAAdapters = adapters
	if *servedModels != "" {
		cfg.ServedModels = strings.Split(*servedModels, ",")
	}
	tokenizers, err := loadTokenizers(*kvrouteConfig, *tokenizer)
	if err != nil {
		fmt.Fprintln(stderr, "mockworker:", err)
		return 1
	}
	cfg.Tokenizers = tokenizers
	s, err := mockworker.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "mockworker:", err)
		return 1
	}
	defer s.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(stderr, "mockworker:", err)
		return 1
	}
	if p := s.Events(); p != nil {
		fmt.Fprintf(stdout, "kv events on %s replay %s\n", p.Addr(), p.ReplayAddr())
		for r := 1; r < cfg.DataParallelSize; r++ {
			p := s.RankEvents(r)
			fmt.Fprintf(stdout, "kv events of rank %d on %s replay %s\n", r, p.Addr(), p.ReplayAddr())
		}
	}
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "mockworker:", err)
		return 1
	}
	return 0
}

// parseAdapters reads -lora-adapters: name=base_model pairs separated by commas.
func parseAdapters(value string) (map[string]string, error) {
	if value == "" {
		return nil, nil
	}
	adapters := map[string]string{}
	for pair := range strings.SplitSeq(value, ",") {
		name, base, ok := strings.Cut(strings.TrimSpace(pair), "=")
		switch {
		case !ok || name == "" || base == "":
			return nil, fmt.Errorf("%q: want name=base_model", pair)
		case adapters[name] != "":
			return nil, fmt.Errorf("adapter %q given twice", name)
		}
		adapters[name] = base
	}
	return adapters, nil
}

// loadTokenizers loads what kvroute would tokenize with: a config's tokenizers
// section, one tokenizer for every model, or the embedded default.
func loadTokenizers(kvrouteConfig, tokenizer string) (*models.Set, error) {
	var tc models.Config
	if kvrouteConfig != "" {
		c, err := config.Load(kvrouteConfig)
		if err != nil {
			return nil, fmt.Errorf("-kvroute-config %s: %w", kvrouteConfig, err)
		}
		tc = c.Tokenizers
	}
	if tokenizer != "" {
		tc = models.Config{models.DefaultKey: {Path: tokenizer}}
	}
	return models.Load(tc, models.Deps{})
}
