package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/onetoken"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
)

// Tokenizers gives each model's prompt encoder, as kvroute's router asks it:
// *models.Set (tokenize/models) satisfies it. Give the worker the set kvroute is
// configured with, so both see the same token ids.
type Tokenizers interface {
	Model(name string) tokenize.PromptEncoder
}

// Config configures a mock worker.
type Config struct {
	Name   string
	Engine sim.Config
	// Speed runs the engine this many times faster than its pass-time model.
	Speed float64
	// DefaultMaxTokens is the output length when a request names none, at most what the
	// context (MaxModelLen) leaves beside its prompt, as vLLM bounds such a request.
	DefaultMaxTokens int
	// TokensPerEvent streams the tokens after the first in SSE events of this many
	// (SGLang's stream_interval; 0 or 1: one event per token, as vLLM does). Fewer events
	// mean fewer ext_proc messages per response behind a STREAMED filter.
	TokensPerEvent int
	// Seed drives the generated words.
	Seed uint64
	// Events, when set, publishes the engine's KV cache events over ZMQ in vLLM's wire
	// format (kvevents.Publisher).
	Events *kvevents.PublisherConfig
	// Tokenizers renders and tokenizes prompts, for the engine and the render
	// endpoints; nil uses the file-free pair (tokenize.Approx and tokenize.ChatML) for
	// every model. Entries in engine mode are not for a worker (it is the engine).
	Tokenizers Tokenizers
	// RenderDelay delays each answer of the render endpoints: a slow render server.
	RenderDelay time.Duration
	// LoRAAdapters maps each LoRA adapter the worker serves to its base model. A request
	// naming an adapter is encoded by the base model's tokenizer, its blocks are cached
	// apart from the base model's, and their BlockStored events carry lora_name and the
	// name in every block's extra keys, as vLLM reports them.
	LoRAAdapters map[string]string
	// MaxModelLen is the worker's context in tokens, as vLLM's --max-model-len: its
	// /v1/models gives it on each base model's card (max_model_len), and a prompt of
	// that many tokens or more gets a 400 before it is scheduled, as does, on the
	// completions, chat, Responses and Messages endpoints and SGLang's /generate, one
	// whose tokens plus the request's bound (max_tokens, max_completion_tokens,
	// max_new_tokens) pass it; vLLM's token-in generate cuts such a bound short at the
	// context instead. 0 is the KV cache's capacity in tokens; a longer one is refused,
	// as vLLM refuses to start with it.
	MaxModelLen int
	// ServedModels, when set, are the only base models the worker serves, as a vLLM
	// started with --served-model-name: /v1/models lists them (with LoRAAdapters), and
	// a completion request naming any other model (not an adapter) gets vLLM's 404.
	// Unset, the worker takes any model name and lists "mock".
	ServedModels []string
	// RenderAPIKey, when set, makes the render endpoints answer 401 to a request
	// without "Authorization: Bearer RenderAPIKey", as vLLM started with --api-key
	// does. The other endpoints stay open (behind kvroute, clients' own keys are the
	// engine's business).
	RenderAPIKey string

	// PrefillSidecar makes the worker also play llm-d's routing sidecar (connector
	// nixlv2) in front of itself, the decode worker of disaggregated prefill/decode: a
	// completion request whose header PrefillerHeader names a prefill worker's
	// host:port is first sent there as a prefill (kv_transfer_params.do_remote_decode,
	// max_tokens 1, not streamed), then decoded here with the KV that worker computed
	// (sim.Request.Transferred, after sim.TransferTime). Without it the header is
	// ignored, as a plain vLLM ignores it. A worker always serves the prefill side.
	PrefillSidecar bool
	// PrefillerHeader names that header; "" is "x-prefiller-host-port", llm-d's.
	PrefillerHeader string
	// PrefillTimeout bounds the sidecar's request to the prefill worker, its queueing
	// included; 0 is one minute.
	PrefillTimeout time.Duration

	// DataParallelSize is how many engines (data-parallel ranks) the server runs behind
	// its one address, as vLLM's internal load balancer with --data-parallel-size N
	// (1-64; 0 is 1). Engine, MaxModelLen and the rest describe one rank. See
	// dataparallel.go: which rank a request goes to, the engine label on /metrics, and
	// each rank's KV events on the endpoints' ports + rank.
	DataParallelSize int
}

// MaxDataParallelSize bounds Config.DataParallelSize.
const MaxDataParallelSize = 64

// DefaultPrefillerHeader is the request header naming the prefill worker, as llm-d's
// endpoint picker sets it.
const DefaultPrefillerHeader = "x-prefiller-host-port"

// Server is a running mock worker. Build it with New, serve Handler(), stop with Close.
type Server struct {
	cfg        Config
	ranks      []*rank // the engines, by data-parallel rank (one without DataParallelSize)
	tokenizers Tokenizers
	words      []string // the generated words, each one token
	start      time.Time

	mu      sync.Mutex // guards the ranks' engines and counters, rng, waiters, nextID
	rng     *rand.Rand
	waiters map[*sim.Request]chan progress // every rank's requests
	nextID  int

	prefillClient *http.Client // the sidecar's client to prefill workers
	// after is the KV transfers' clock, time.After; a test replaces it before serving
	// to see a transfer's wait and to end it.
	after func(time.Duration) <-chan time.Time

	cancel context.CancelFunc

	sessions sglangSessions // SGLang's open sessions (sglang_session.go)
}

// progress is what a pass did for one request.
type progress struct {
	generated int
	finished  bool
}

// New starts the worker's engine loop.
func New(cfg Config) (*Server, error) {
	if cfg.Speed <= 0 {
		return nil, fmt.Errorf("speed: must be > 0, got %v", cfg.Speed)
	}
	if cfg.TokensPerEvent <= 0 {
		cfg.TokensPerEvent = 1
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 16
	}
	if cfg.PrefillerHeader == "" {
		cfg.PrefillerHeader = DefaultPrefillerHeader
	}
	switch {
	case cfg.MaxModelLen < 0:
		return nil, fmt.Errorf("max_model_len: must be ≥ 0 (0: the KV cache's tokens), got %d", cfg.MaxModelLen)
	case cfg.MaxModelLen == 0:
		cfg.MaxModelLen = cfg.Engine.NumGPUBlocks * cfg.Engine.BlockSize
	case cfg.MaxModelLen > cfg.Engine.NumGPUBlocks*cfg.Engine.BlockSize:
		// vLLM refuses to start too: a lone request of the whole context must fit.
		return nil, fmt.Errorf("max_model_len: %d tokens do not fit in the KV cache's %d blocks of %d tokens", cfg.MaxModelLen, cfg.Engine.NumGPUBlocks, cfg.Engine.BlockSize)
	}
	switch {
	case cfg.PrefillTimeout < 0:
		return nil, fmt.Errorf("prefill_timeout: must be ≥ 0 (0: one minute), got %v", cfg.PrefillTimeout)
	case cfg.PrefillTimeout == 0:
		cfg.PrefillTimeout = time.Minute
	}
	switch {
	case cfg.DataParallelSize < 0 || cfg.DataParallelSize > MaxDataParallelSize:
		return nil, fmt.Errorf("data_parallel_size: must be 1-%d (0: 1), got %d", MaxDataParallelSize, cfg.DataParallelSize)
	case cfg.DataParallelSize == 0:
		cfg.DataParallelSize = 1
	}
	ranks, err := newRanks(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	tokenizers := cfg.Tokenizers
	if tokenizers == nil {
		tokenizers = router.OneTokenizer(tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}})
	}
	s := &Server{cfg: cfg, ranks: ranks, tokenizers: tokenizers, words: onetoken.Words(), start: time.Now(),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x77)), waiters: map[*sim.Request]chan progress{},
		cancel: cancel, prefillClient: newPrefillClient(cfg.PrefillTimeout), after: time.After}
	for _, rk := range ranks {
		go s.loop(ctx, rk)
	}
	return s, nil
}

// Events returns the KV events publisher (nil without Config.Events), for its
// endpoints: rank 0's with DataParallelSize (RankEvents gives the others').
func (s *Server) Events() *kvevents.Publisher { return s.ranks[0].publisher }

// HostTokens is the prompt tokens the engines have loaded from their host tiers
// (sim.Engine.HostTokens, summed over the ranks; 0 without Engine.HostBlocks).
func (s *Server) HostTokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, rk := range s.ranks {
		n += rk.engine.HostTokens
	}
	return n
}

// publish sends one pass's KV events of rank rk as one batch, as vLLM does per engine
// step: with data parallelism the batch names its rank (data_parallel_rank).
func (s *Server) publish(rk *rank, events []sim.Event) {
	if rk.publisher == nil || len(events) == 0 {
		return
	}
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9}
	if len(s.ranks) > 1 {
		b.Rank, b.HasRank = rk.id, true
	}
	for _, ev := range events {
		b.Events = append(b.Events, ev.Wire(s.cfg.Engine.BlockSize, "GPU"))
	}
	_ = rk.publisher.Publish(&b) // like vLLM, a publish error loses the batch (a gap)
}

// Close stops the engine loops and the events publishers; requests in flight end.
func (s *Server) Close() {
	s.cancel()
	for _, rk := range s.ranks {
		<-rk.done
	}
	s.failAll()
	s.prefillClient.CloseIdleConnections()
	closeRanks(s.ranks)
}

// now is the engine's clock: real time since start, scaled by Speed.
func (s *Server) now() time.Duration {
	return time.Duration(float64(time.Since(s.start)) * s.cfg.Speed)
}

// loop runs rank rk's passes back to back while there is work, sleeping each pass's
// duration (scaled by Speed) between its start and its end.
func (s *Server) loop(ctx context.Context, rk *rank) {
	defer close(rk.done)
	for {
		s.mu.Lock()
		start := s.now()
		d, ok, _ := rk.engine.StartPass(start)
		s.mu.Unlock()
		if !ok {
			select {
			case <-rk.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-time.After(time.Duration(float64(d) / s.cfg.Speed)):
		case <-ctx.Done():
			return
		}
		s.mu.Lock()
		outs, events := rk.engine.EndPass(start + d)
		for _, o := range outs {
			if ch, ok := s.waiters[o.Request]; ok {
				ch <- progress{generated: o.Request.Generated, finished: o.Finished}
				if o.Finished {
					delete(s.waiters, o.Request)
				}
			}
		}
		s.mu.Unlock()
		s.publish(rk, events)
	}
}

func (s *Server) failAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, ch := range s.waiters {
		close(ch)
		delete(s.waiters, r)
	}
}

// work is one generation as an endpoint read its request: what the engine runs.
type work struct {
	encoder   tokenize.PromptEncoder // the model's (an adapter's base model's), for the output words
	prompt    []uint32
	maxTokens int
	lora      string // the LoRA adapter named, "" for the base model
	cacheSalt string // the request's cache_salt, "" for none
	// rank is the engine the request goes to: the one its header pins (pinnedRank), or
	// nil for the balancer's pick when submitted (balanceLocked).
	rank *rank
}

// salt is the engine's salt of the work's blocks (engineSalt).
func (wk work) salt() uint64 { return engineSalt(wk.lora, wk.cacheSalt) }

// submit queues a request on wk.rank (nil: the one the balancer picks, in the same
// critical section as the request is queued) and returns that rank and the channel its
// progress arrives on (closed if the worker stops). Its output is words of one token
// each, as wk.encoder encodes them. transferred marks a prompt whose KV a prefill worker
// computed (sim.Request.Transferred).
func (s *Server) submit(ctx context.Context, wk work, transferred bool) (*rank, *sim.Request, []string, chan progress, error) {
	encoder, prompt, maxTokens := wk.encoder, wk.prompt, wk.maxTokens
	words := make([]string, maxTokens)
	s.mu.Lock()
	for i := range words {
		words[i] = " " + s.words[s.rng.IntN(len(s.words))]
	}
	s.mu.Unlock()
	out := make([]uint32, maxTokens)
	for i, w := range words {
		// The word's id is the last one: a tokenizer may add a BOS to a text prompt.
		enc, err := encoder.EncodePrompt(ctx, tokenize.Prompt{Text: w})
		ids := enc.IDs
		if err != nil || len(ids) == 0 {
			return nil, nil, nil, nil, fmt.Errorf("encode the output word %q: %v", w, err)
		}
		out[i] = ids[len(ids)-1]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rk := wk.rank
	if rk == nil {
		rk = s.balanceLocked()
	}
	r := &sim.Request{ID: s.nextID, Salt: wk.salt(), LoRA: wk.lora, CacheSalt: wk.cacheSalt, Prompt: prompt, Output: out, Transferred: transferred}
	s.nextID++
	if err := rk.engine.Add(r); err != nil {
		return nil, nil, nil, nil, err
	}
	ch := make(chan progress, maxTokens+1)
	s.waiters[r] = ch
	select {
	case rk.wake <- struct{}{}:
	default:
	}
	return rk, r, words, ch, nil
}

// engineSalt is the engine's own salt of a request's blocks: any one that keeps an
// adapter's and a cache salt's blocks apart will do, since the events carry token ids
// (with the adapter and the salt, as vLLM's) and kvroute hashes them itself.
func engineSalt(lora, cacheSalt string) uint64 { return index.Salt("", lora, cacheSalt) }

// abort removes a request of rank rk whose client went away.
func (s *Server) abort(rk *rank, r *sim.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiters[r]; !ok {
		return
	}
	delete(s.waiters, r)
	rk.engine.Abort(r, s.now())
}

// admitted records rank rk's prefix-cache outcome once a request has its first token.
func (s *Server) admitted(rk *rank, r *sim.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rk.queries += float64(len(r.Prompt))
	rk.hits += float64(r.CachedTokens)
}

// Handler returns the worker's HTTP API.
func (s *Server) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	// Every series is one engine's: with data parallelism each rank has its own, labelled
	// engine="<rank>" as vLLM labels them; one engine's carry no label, as before.
	for _, rk := range s.ranks {
		var labels prometheus.Labels
		if len(s.ranks) > 1 {
			labels = prometheus.Labels{"engine": strconv.Itoa(rk.id)}
		}
		gauge := func(name, help string, f func() float64) {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				return f()
			}))
		}
		counter := func(name, help string, f func() float64) {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
				s.mu.Lock()
				defer s.mu.Unlock()
				return f()
			}))
		}
		gauge("vllm:num_requests_running", "Requests running on the engine.", func() float64 { return float64(rk.engine.Running()) })
		gauge("vllm:num_requests_waiting", "Requests waiting to be admitted.", func() float64 { return float64(rk.engine.Waiting()) })
		gauge("vllm:kv_cache_usage_perc", "Share of KV blocks held by running requests (0-1).", func() float64 { return rk.engine.KVUsage() })
		// vLLM's counters are prometheus_client's, whose samples end in _total.
		counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", func() float64 { return rk.queries })
		counter("vllm:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", func() float64 { return rk.hits })
		// Not vLLM's: what tests of disaggregated prefill/decode check a worker did.
		counter("mockworker_remote_prefill_requests_total", "Requests served as the prefill of a disaggregated request (kv_transfer_params.do_remote_decode).",
			func() float64 { return rk.remotePrefills })
		counter("mockworker_transferred_prompt_tokens_total", "Prompt tokens whose KV was read from a prefill worker rather than computed.",
			func() float64 { return float64(rk.engine.TransferredTokens) })
		// vLLM's info gauge: value 1, the cache's configuration in its labels (engine "0"
		// with one engine too, as vLLM's). kvroute reads the worker's KV capacity from
		// num_gpu_blocks: each rank's own.
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{
				"block_size": strconv.Itoa(s.cfg.Engine.BlockSize), "num_gpu_blocks": strconv.Itoa(s.cfg.Engine.NumGPUBlocks),
				"cache_dtype": "auto", "enable_prefix_caching": "True", "engine": strconv.Itoa(rk.id), "num_cpu_blocks": "None",
			},
		}, func() float64 { return 1 }))

		if s.cfg.Engine.MaxLoRAs > 0 {
			reg.MustRegister(loraInfo{s: s, rk: rk, desc: newLoRAInfoDesc(labels)})
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveCompletion(w, r, false) })
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) { s.serveConverted(w, r, tokenize.APIMessages) })
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) { s.serveConverted(w, r, tokenize.APIResponses) })
	mux.HandleFunc("POST "+generatePath, s.serveGenerate)
	mux.HandleFunc("POST "+sglangGeneratePath, s.serveSGLangGenerate)
	mux.HandleFunc("PUT "+sglangGeneratePath, s.serveSGLangGenerate) // SGLang takes both
	// SGLang's session endpoints take GET and POST alike (api_route), with a JSON body.
	for _, method := range []string{"GET ", "POST "} {
		mux.HandleFunc(method+"/open_session", s.serveSGLangOpenSession)
		mux.HandleFunc(method+"/close_session", s.serveSGLangCloseSession)
	}
	for path, api := range map[string]tokenize.API{"/v1/chat/completions/render": tokenize.APIChat, "/v1/completions/render": tokenize.APICompletions,
		"/v1/responses/render": tokenize.APIResponses, "/v1/messages/render": tokenize.APIMessages} {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) { s.serveRender(w, r, api) })
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "application/json")
		models := []map[string]any{}
		served := s.cfg.ServedModels
		if len(served) == 0 {
			served = []string{"mock"}
		}
		for _, name := range served {
			models = append(models, map[string]any{"id": name, "object": "model", "parent": nil, "max_model_len": s.cfg.MaxModelLen})
		}
		for _, name := range slices.Sorted(maps.Keys(s.cfg.LoRAAdapters)) {
			models = append(models, map[string]any{"id": name, "object": "model", "parent": s.cfg.LoRAAdapters[name]})
		}
		b, _ := json.Marshal(map[string]any{"object": "list", "data": models})
		_, _ = w.Write(b)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// loraInfo is vLLM's vllm:lora_requests_info gauge of one rank: the time of the
// reading, with the engine's --max-loras and its running and waiting adapters in the
// labels (and the engine's rank with data parallelism, which vLLM's metrics refuse
// with LoRA: the mock's own extension).
type loraInfo struct {
	s    *Server
	rk   *rank
	desc *prometheus.Desc
}

func newLoRAInfoDesc(labels prometheus.Labels) *prometheus.Desc {
	return prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.",
		[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, labels)
}

func (l loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- l.desc }

func (l loraInfo) Collect(ch chan<- prometheus.Metric) {
	l.s.mu.Lock()
	running, waiting := l.rk.engine.Adapters()
	l.s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(l.desc, prometheus.GaugeValue, float64(time.Now().UnixNano())/1e9,
		strconv.Itoa(l.s.cfg.Engine.MaxLoRAs), strings.Join(running, ","), strings.Join(waiting, ","))
}
