package mockworker

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/sim"
)

// dpEngine is each rank's engine in these tests.
var dpEngine = sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}

// startRanks starts a worker of n data-parallel ranks and returns it and its URL.
func startRanks(t *testing.T, n int) (*Server, string) {
	t.Helper()
	s, err := New(Config{Name: "w0", Engine: dpEngine, Speed: 100, Seed: 1, DataParallelSize: n})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, srv.URL
}

// postRank posts body to path with the rank header set to rank (raw header name, so its
// case is the test's; none when rank is nil) and returns the status, the answer's
// headers and its body.
func postRank(t *testing.T, url, path, body, name string, rank *string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	if rank != nil {
		req.Header[name] = []string{*rank}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

func ptr(s string) *string { return &s }

// loadRanks queues waiting[r] requests on rank r without waking its engine, so they
// stay waiting: the load the balancer sees. A rank's loop may still run them (one that
// has not yet parked when they are queued sees them in its first pass), so each asks
// for loadOutput tokens: waiting or running, it is the rank's load for at least
// loadOutput passes, far longer than the test's request takes to reach the balancer.
func loadRanks(t *testing.T, s *Server, waiting []int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for r, n := range waiting {
		for range n {
			require.NoError(t, s.ranks[r].engine.Add(&sim.Request{ID: -1 - s.nextID, Prompt: []uint32{1, 2, 3}, Output: make([]uint32, loadOutput)}))
			s.nextID++
		}
	}
}

// loadOutput is the output tokens of loadRanks' requests: at least as many passes.
const loadOutput = 1000

const (
	dpChat        = `{"model":"mock","messages":[{"role":"user","content":"` + dpWords + `"}],"max_tokens":2}`
	dpCompletions = `{"model":"mock","prompt":"` + dpWords + `","max_tokens":2}`
	dpMessages    = `{"model":"mock","max_tokens":2,"messages":[{"role":"user","content":"` + dpWords + `"}]}`
	dpResponses   = `{"model":"mock","store":false,"max_output_tokens":2,"input":"` + dpWords + `"}`
	dpSGLang      = `{"text":"` + dpWords + `","sampling_params":{"max_new_tokens":2}}`
	dpWords       = "a long enough prompt to fill several blocks of the cache a long enough prompt to fill several blocks of the cache a long enough prompt to fill several blocks"
)

// dpGenerate is a token-in generate body of 80 token ids.
var dpGenerate = func() string {
	ids := make([]string, 80)
	for i := range ids {
		ids[i] = strconv.Itoa(100 + i)
	}
	return `{"token_ids":[` + strings.Join(ids, ",") + `],"sampling_params":{"max_tokens":2}}`
}()

// pinnedEndpoints are the endpoints whose requests the rank header pins, as vLLM's.
var pinnedEndpoints = []struct{ name, path, body string }{
	{"chat", "/v1/chat/completions", dpChat},
	{"completions", "/v1/completions", dpCompletions},
	{"generate", generatePath, dpGenerate},
	{"messages", "/v1/messages", dpMessages},
}

// cached reads an answer's cached prompt tokens, whatever its API's usage.
func cached(t *testing.T, b []byte) int {
	t.Helper()
	u, found, err := openai.ParseUsage(b)
	require.NoError(t, err, string(b))
	require.True(t, found, string(b))
	return int(u.CachedTokens)
}

// The rank header pins a request to its rank on every endpoint vLLM reads it on, in
// any case and as Python's int() reads it: the second request hits the first one's
// blocks in that rank's cache, and another rank, whose cache is its own, misses them.
func TestRankHeaderPinsTheRequestToItsRanksCache(t *testing.T) {
	for _, ep := range pinnedEndpoints {
		for _, tt := range []struct{ name, header, value, want string }{
			{"canonical header", "X-Data-Parallel-Rank", "2", "2"},
			{"mixed-case header", "x-DATA-parallel-rank", "1", "1"},
			{"spaces and a sign", "X-Data-Parallel-Rank", " +1 ", "1"},
			{"underscores and leading zeros", "X-Data-Parallel-Rank", "0_2", "2"},
		} {
			t.Run(ep.name+"/"+tt.name, func(t *testing.T) {
				_, url := startRanks(t, 3)
				status, h, b := postRank(t, url, ep.path, ep.body, tt.header, ptr(tt.value))
				require.Equal(t, http.StatusOK, status, string(b))
				assert.Equal(t, tt.want, h.Get("x-data-parallel-rank"))
				assert.Equal(t, "w0", h.Get("x-served-by"))
				assert.Zero(t, cached(t, b), "the first request finds nothing")

				status, h, b = postRank(t, url, ep.path, ep.body, tt.header, ptr(tt.value))
				require.Equal(t, http.StatusOK, status, string(b))
				assert.Equal(t, tt.want, h.Get("x-data-parallel-rank"))
				assert.Positive(t, cached(t, b), "the second hits its rank's cache")

				status, h, b = postRank(t, url, ep.path, ep.body, tt.header, ptr("0"))
				require.Equal(t, http.StatusOK, status, string(b))
				assert.Equal(t, "0", h.Get("x-data-parallel-rank"))
				assert.Zero(t, cached(t, b), "rank 0's cache is its own")
			})
		}
	}
}

// A rank outside [0, N) is refused with vLLM's 400 and its words, before anything is
// scheduled.
func TestRankOutOfRangeIsA400(t *testing.T) {
	s, url := startRanks(t, 2)
	for _, ep := range pinnedEndpoints {
		for _, tt := range []struct{ value, rank string }{
			{"2", "2"},
			{"-1", "-1"},
			{" 7 ", "7"},
			{"123456789012345678901234567890", "123456789012345678901234567890"},
		} {
			t.Run(ep.name+"/"+tt.value, func(t *testing.T) {
				status, h, b := postRank(t, url, ep.path, ep.body, "X-Data-Parallel-Rank", ptr(tt.value))
				require.Equal(t, http.StatusBadRequest, status, string(b))
				assert.Empty(t, h.Get("x-data-parallel-rank"))
				msg := "data_parallel_rank " + tt.rank + " is out of range [0, 2)."
				if ep.path == "/v1/messages" {
					assert.JSONEq(t, `{"type":"error","error":{"type":"invalid_request_error","message":"`+msg+`"}}`, string(b))
					return
				}
				assert.JSONEq(t, `{"error":{"message":"`+msg+`","type":"BadRequestError","param":null,"code":400}}`, string(b))
			})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rk := range s.ranks {
		assert.True(t, rk.engine.Idle(), "nothing was queued")
	}
}

// Without the header, with a value that is not an integer, and on the endpoints vLLM
// (and SGLang) do not pin by header, the balancer picks: the rank with the fewest
// waiting plus running requests, ties to the lowest rank.
func TestBalancerPicksTheLeastLoadedRank(t *testing.T) {
	tests := []struct {
		name       string
		load       []int // waiting requests on each rank
		path, body string
		header     *string
		want       string
	}{
		{"idle ranks: the lowest", []int{0, 0, 0}, "/v1/chat/completions", dpChat, nil, "0"},
		{"the least loaded", []int{2, 0, 1}, "/v1/chat/completions", dpChat, nil, "1"},
		{"a tie among the least loaded: the lowest", []int{3, 1, 1}, "/v1/completions", dpCompletions, nil, "1"},
		{"the last rank", []int{1, 1, 0}, generatePath, dpGenerate, nil, "2"},
		{"a word is ignored", []int{1, 0, 1}, "/v1/chat/completions", dpChat, ptr("one"), "1"},
		{"a decimal fraction is ignored", []int{1, 0, 1}, "/v1/completions", dpCompletions, ptr("0.0"), "1"},
		{"an empty value is ignored", []int{1, 0, 1}, generatePath, dpGenerate, ptr(""), "1"},
		{"a doubled sign is ignored", []int{1, 0, 1}, "/v1/messages", dpMessages, ptr("--0"), "1"},
		{"a stray underscore is ignored", []int{1, 0, 1}, "/v1/chat/completions", dpChat, ptr("_0"), "1"},
		{"responses ignore the header", []int{1, 0, 1}, "/v1/responses", dpResponses, ptr("0"), "1"},
		{"responses ignore an out-of-range header", []int{1, 0, 1}, "/v1/responses", dpResponses, ptr("9"), "1"},
		{"SGLang's generate ignores the header", []int{1, 1, 0}, sglangGeneratePath, dpSGLang, ptr("0"), "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startRanks(t, len(tt.load))
			loadRanks(t, s, tt.load)
			status, h, b := postRank(t, url, tt.path, tt.body, "X-Data-Parallel-Rank", tt.header)
			require.Equal(t, http.StatusOK, status, string(b))
			assert.Equal(t, tt.want, h.Get("x-data-parallel-rank"))
		})
	}
}

// scrape parses the worker's /metrics.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// labelsOf is a series' labels.
func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// valueOf is a gauge's or counter's value.
func valueOf(m *dto.Metric) float64 {
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}

// perEngine are the series each engine has on /metrics.
var perEngine = []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
	"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:cache_config_info",
	"mockworker_remote_prefill_requests_total", "mockworker_transferred_prompt_tokens_total", "vllm:lora_requests_info"}

// With N ranks every per-engine series is there once per rank, labelled engine="<rank>"
// as vLLM labels them, each with its own rank's values; with one rank none carries the
// label but vllm:cache_config_info, whose engine is "0", as before ranks.
func TestMetricsHaveASeriesPerRankWithTheEngineLabel(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(strconv.Itoa(n)+" ranks", func(t *testing.T) {
			engine := dpEngine
			engine.MaxLoRAs = 2
			s, err := New(Config{Name: "w0", Engine: engine, Speed: 100, Seed: 1, DataParallelSize: n})
			require.NoError(t, err)
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(func() { srv.Close(); s.Close() })
			rank := n - 1
			for range 2 {
				status, _, b := postRank(t, srv.URL, "/v1/completions", dpCompletions, "X-Data-Parallel-Rank", ptr(strconv.Itoa(rank)))
				require.Equal(t, http.StatusOK, status, string(b))
			}
			loadRanks(t, s, []int{1})

			families := scrape(t, srv.URL)
			for _, name := range perEngine {
				f := families[name]
				require.NotNil(t, f, name)
				require.Len(t, f.GetMetric(), n, name)
				seen := map[string]bool{}
				for _, m := range f.GetMetric() {
					engine, ok := labelsOf(m)["engine"]
					if n == 1 && name != "vllm:cache_config_info" {
						assert.False(t, ok, "%s: no engine label with one rank", name)
						continue
					}
					require.True(t, ok, name)
					seen[engine] = true
					switch name {
					case "vllm:num_requests_waiting":
						assert.Equal(t, map[bool]float64{true: 1}[engine == "0"], valueOf(m), "%s{engine=%s}", name, engine)
					case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total":
						if engine == strconv.Itoa(rank) {
							assert.Positive(t, valueOf(m), "%s{engine=%s}: the rank served both", name, engine)
						} else {
							assert.Zero(t, valueOf(m), "%s{engine=%s}", name, engine)
						}
					case "vllm:cache_config_info":
						assert.Equal(t, "256", labelsOf(m)["num_gpu_blocks"], "each rank's own blocks")
					}
				}
				if n > 1 || name == "vllm:cache_config_info" {
					assert.Len(t, seen, n, "%s: one series per rank", name)
				}
			}
		})
	}
}

// With one rank the worker is what it was: the rank header is ignored (no 400 for a
// rank vLLM would refuse) and the answer names no rank.
func TestOneRankIgnoresTheRankHeader(t *testing.T) {
	_, url := startRanks(t, 1)
	for _, v := range []*string{nil, ptr("0"), ptr("1"), ptr("x")} {
		status, h, b := postRank(t, url, "/v1/chat/completions", dpChat, "X-Data-Parallel-Rank", v)
		require.Equal(t, http.StatusOK, status, string(b))
		_, named := h["X-Data-Parallel-Rank"]
		assert.False(t, named, "no rank header with one rank")
	}
}

// startRankEvents starts a worker of n ranks publishing KV events and replays on ports
// picked for rank 0; a port a further rank needs may be taken, so it tries a few times.
func startRankEvents(t *testing.T, n int) (*Server, string) {
	t.Helper()
	var s *Server
	var err error
	for range 5 {
		s, err = New(Config{Name: "w0", Engine: dpEngine, Speed: 100, Seed: 1, DataParallelSize: n,
			Events: &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
		if err == nil {
			break
		}
	}
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, srv.URL
}

// portOf is a tcp endpoint's port.
func portOf(t *testing.T, ep string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	require.NoError(t, err, ep)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	return p
}

// Rank r publishes its KV events on the endpoint's port + r and serves replays on the
// replay endpoint's port + r, each batch naming data_parallel_rank r; with one rank a
// batch names none, as before ranks.
func TestRankEventsArePublishedOnPortPlusRank(t *testing.T) {
	for _, tt := range []struct {
		name        string
		ranks, rank int
		wantRank    bool
	}{
		{"rank 1 of 2", 2, 1, true},
		{"rank 2 of 3", 3, 2, true},
		{"rank 0 of 2", 2, 0, true},
		{"one rank", 1, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, url := startRankEvents(t, tt.ranks)
			first := s.Events()
			endpoint := "tcp://127.0.0.1:" + strconv.Itoa(portOf(t, first.Addr())+tt.rank)
			assert.Equal(t, endpoint, s.RankEvents(tt.rank).Addr())
			assert.Equal(t, portOf(t, first.ReplayAddr())+tt.rank, portOf(t, s.RankEvents(tt.rank).ReplayAddr()), "replays on the replay port + rank")

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			require.NoError(t, sub.Dial(endpoint))
			require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
			require.Eventually(t, s.RankEvents(tt.rank).Subscribed, 10*time.Second, time.Millisecond)

			status, h, b := postRank(t, url, "/v1/completions", dpCompletions, "X-Data-Parallel-Rank", ptr(strconv.Itoa(tt.rank)))
			require.Equal(t, http.StatusOK, status, string(b))
			if tt.ranks > 1 {
				require.Equal(t, strconv.Itoa(tt.rank), h.Get("x-data-parallel-rank"))
			}
			msg, err := sub.Recv()
			require.NoError(t, err, "the rank's batch arrives on its port")
			require.Len(t, msg.Frames, 3)
			batch, err := kvevents.NewDecoder().Decode(msg.Frames[2])
			require.NoError(t, err)
			assert.NotEmpty(t, batch.Events)
			assert.Equal(t, tt.wantRank, batch.HasRank, "data_parallel_rank present")
			assert.Equal(t, tt.rank, batch.Rank, "data_parallel_rank")
			for r := range tt.ranks {
				if r != tt.rank {
					assert.False(t, s.RankEvents(r).Subscribed(), "nobody listens to rank %d", r)
				}
			}
		})
	}
}

// A worker's size is 1-64 ranks (0 is 1), and ranks after the first need tcp ports.
func TestDataParallelSizeIsChecked(t *testing.T) {
	for _, tt := range []struct {
		name   string
		size   int
		events *kvevents.PublisherConfig
		err    string
	}{
		{"negative", -1, nil, "data_parallel_size: must be 1-64"},
		{"too many", 65, nil, "data_parallel_size: must be 1-64"},
		{"ipc for two ranks", 2, &kvevents.PublisherConfig{Endpoint: "ipc://" + t.TempDir() + "/kv"}, "need a tcp endpoint"},
		{"64", 64, nil, ""},
		{"0 is 1", 0, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Name: "w0", Engine: dpEngine, Speed: 100, DataParallelSize: tt.size, Events: tt.events})
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			defer s.Close()
			assert.Len(t, s.ranks, max(tt.size, 1))
		})
	}
}
