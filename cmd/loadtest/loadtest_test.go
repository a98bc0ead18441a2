package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestLoadFor20Seconds is CI's load test: the real loop (the extproc binary, built here
// with the race detector when the test has it, the envoytest data plane, mockworkers)
// for 20 s with 16 streams, through two kvroute replicas that exchange their booked
// load (peers). It fails on any error, a leaked booking in either replica, a kvroute
// stream error or panic; it asserts nothing about timing, and its timeouts are
// generous. A hostile stream of each kind (small bodies, paced) runs beside the load:
// kvroute must route every one of them, and /proc must have been read.
func TestLoadFor20Seconds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 20 s load test")
	}
	bin := buildExtproc(t)
	o := defaultOptions()
	o.bin, o.streams, o.workers, o.replicas, o.peers = bin, 16, 2, 2, true
	o.duration, o.warmup, o.sample, o.drain = 20*time.Second, 5*time.Second, 5*time.Second, 2*time.Minute
	// The machine may be saturated by other tests: a message timeout would turn CPU
	// starvation into 504s, and this test is about errors of kvroute's, not speed.
	o.msgTimeout = time.Minute
	o.hostileStreams, o.hostileKinds, o.hostileBytes, o.hostileEvery = 1, hostileKinds, 64<<10, 500*time.Millisecond
	var progress strings.Builder
	rep, err := run(context.Background(), o, &progress)
	require.NoError(t, err)
	t.Log(progress.String())
	var printed strings.Builder
	rep.print(&printed)
	t.Log(printed.String())

	assert.Empty(t, rep.failures())
	assert.Positive(t, rep.Requests, "requests answered after the warm-up")
	assert.Len(t, rep.BookingsLeft, len(bookingGauges), "every booking gauge was read")
	for _, g := range bookingGauges {
		assert.Zero(t, rep.BookingsLeft[g], g)
	}
	assert.Positive(t, rep.RoundTrip["request_body"].Count, "the data plane timed kvroute's decisions")
	assert.Positive(t, rep.Stages["tokenize"].Count, "kvroute's stage histogram was read")
	assert.NotEmpty(t, rep.samples, "samples were taken")
	require.Len(t, rep.others, 1, "the second replica's end was checked")
	assert.Contains(t, progress.String(), "peers exchange: true")
	require.Len(t, rep.Hostile, len(hostileKinds), "each hostile kind is reported")
	for kind, h := range rep.Hostile {
		assert.Positive(t, h.Sent, kind)
		assert.Equal(t, map[string]int64{"routed": h.Sent}, h.Outcomes, "%s: every hostile request routed, and refused by its worker", kind)
	}
	assert.Empty(t, rep.Proc.Err, "/proc was read")
	assert.GreaterOrEqual(t, rep.Proc.PeakRSS, rep.Proc.MaxRSSMeasured)
	assert.Positive(t, rep.Proc.MaxRSSMeasured)
	assert.Positive(t, rep.Proc.CPUMeasured)
}

// buildExtproc builds the kvroute under test into a temporary directory, with the race
// detector when the test has it.
func buildExtproc(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	args := []string{"build", "-o", bin + "/"}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "../extproc")...).CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// TestLoadInEachAPI runs a tiny load (4 streams for 5 s, short prompts) in each -api
// shape through the real loop: kvroute must route every request on its prompt (the
// converted chat, for Messages and Responses bodies, the token_ids for generate ones,
// the input_ids for sglang ones, whose model is default_model: outcome routed, never
// load_only; an SGLang session's turns go to the engine that opened it, and only its
// opens and closes are load_only),
// the workers must find the sessions' earlier turns cached (their usage, read in the
// API's shape, says so), and the report must hold the figures a run is read for.
func TestLoadInEachAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs six 5 s load tests")
	}
	bin := buildExtproc(t)
	for _, api := range bodyAPIs {
		t.Run(string(api), func(t *testing.T) {
			o := defaultOptions()
			o.bin, o.streams, o.workers, o.load.api = bin, 4, 2, api
			o.duration, o.warmup, o.sample, o.drain, o.msgTimeout = 5*time.Second, time.Second, time.Second, 30*time.Second, time.Minute
			o.load.prefixTokens, o.load.userTokens, o.load.maxPromptTokens, o.load.outputTokens = 200, 32, 600, 16
			var progress strings.Builder
			rep, err := run(context.Background(), o, &progress)
			require.NoError(t, err)
			var printed strings.Builder
			rep.print(&printed)
			t.Log(progress.String(), printed.String())

			assert.Empty(t, rep.failures())
			assert.Equal(t, string(api), rep.API)
			assert.Contains(t, printed.String(), "POST "+api.path())
			require.Positive(t, rep.Requests, "requests answered after the warm-up")
			if api == apiSGLangSession {
				// The turns go to their session's engine; the opens and closes by load.
				assert.Equal(t, []string{"load_only", "routed"}, sortedKeys(rep.KvrouteOutcomes))
				assert.LessOrEqual(t, rep.KvrouteOutcomes["load_only"], float64(rep.sessionControls))
				require.NotNil(t, rep.SGLangSessions)
				assert.Positive(t, rep.SGLangSessions.Opened)
				assert.Positive(t, rep.SGLangSessions.Closed)
				assert.Zero(t, rep.SGLangSessions.Aborted, "every turn reached the engine holding its session")
				assert.Contains(t, printed.String(), "SGLang sessions: ")
				assert.Zero(t, rep.Moved, "no turn left its session's engine")
			} else {
				assert.Equal(t, []string{"routed"}, sortedKeys(rep.KvrouteOutcomes), "every request routed on its prompt")
				assert.Nil(t, rep.SGLangSessions)
			}
			assert.GreaterOrEqual(t, rep.KvrouteOutcomes["routed"], float64(rep.Requests))
			assert.Greater(t, rep.HitRatio, 0.3, "later turns find the session's prefix cached")
			assert.Positive(t, rep.Resumed, "sessions ran past their first turn")
			// A request begun before the warm-up's end is counted, its TTFT is not: one a stream.
			assert.InDelta(t, rep.Requests, rep.TTFT.Count, float64(o.streams), "each request's text was read")
			assert.Positive(t, rep.RoundTrip["request_body"].Count, "the data plane timed kvroute's decisions")
			assert.Positive(t, rep.Stages["tokenize"].Count, "kvroute's stage histogram was read")
			assert.Positive(t, rep.AllocsPerRequest)
			assert.Positive(t, rep.KvrouteCPU)
		})
	}
}

// TestLoadWithTenants runs two tenants (3 streams of a, 1 of b) for 5 s through the
// real loop on one worker of 2 batch slots (max_active_requests_per_worker 2), with
// flow control off and on. Off, kvroute refuses what the worker cannot take and the
// streams retry their 429s: the run passes, kvroute answered nothing but routed and
// rate_limit_exceeded requests, and each tenant has its row. On (max_wait a minute,
// past anything this run can wait), kvroute holds those requests instead: no 429, and
// flow control's queue is empty after the drain. Nothing about time is asserted.
func TestLoadWithTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 5 s load tests")
	}
	bin := buildExtproc(t)
	dir := t.TempDir()
	tests := []struct {
		name, config string
		flowControl  bool
	}{
		{"flow control off", "max_active_requests_per_worker: 2\n", false},
		{"flow control on", "max_active_requests_per_worker: 2\nflow_control: {enabled: true, max_wait: 1m}\n", true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaultOptions()
			o.kvrouteConfig = filepath.Join(dir, fmt.Sprint("kvroute", i, ".yaml"))
			require.NoError(t, os.WriteFile(o.kvrouteConfig, []byte(tt.config), 0o600))
			o.bin, o.workers, o.maxNumSeqs = bin, 1, 2
			o.load.tenants = []tenant{{"a", 3}, {"b", 1}}
			o.streams = groupStreams(o.load.tenants)
			// -sample past the run's end: no sample is taken, and the report's
			// maxima come from the warm-up's and the end's readings.
			o.duration, o.warmup, o.sample, o.drain, o.msgTimeout = 5*time.Second, time.Second, time.Minute, 30*time.Second, 2*time.Minute
			o.load.prefixTokens, o.load.userTokens, o.load.maxPromptTokens, o.load.outputTokens = 200, 32, 600, 16
			var progress strings.Builder
			rep, err := run(context.Background(), o, &progress)
			require.NoError(t, err)
			var printed strings.Builder
			rep.print(&printed)
			t.Log(progress.String(), printed.String())

			assert.Empty(t, rep.failures())
			require.Len(t, rep.Tenants, 2)
			assert.Empty(t, rep.samples)
			assert.Positive(t, rep.GoroutinesMax, "kvroute's goroutines read at the warm-up and the end")
			assert.Equal(t, 3, rep.Tenants["a"].Streams)
			assert.Equal(t, 1, rep.Tenants["b"].Streams)
			assert.Equal(t, rep.Requests, rep.Tenants["a"].Requests+rep.Tenants["b"].Requests, "every request served is a tenant's")
			assert.Contains(t, printed.String(), "tenant (x-llm-d-inference-fairness-id)")
			for outcome := range rep.KvrouteOutcomes {
				assert.Contains(t, []string{"routed", rateLimitOutcome}, outcome)
			}
			if !tt.flowControl {
				assert.Nil(t, rep.FlowControl)
				require.NotNil(t, rep.RateLimited)
				assert.Equal(t, int64(rep.KvrouteOutcomes[rateLimitOutcome]), *rep.RateLimited, "each 429 kvroute sent was retried")
				return
			}
			require.NotNil(t, rep.FlowControl)
			require.NotNil(t, rep.RateLimited)
			assert.Zero(t, *rep.RateLimited, "held, not refused")
			assert.Zero(t, rep.FlowControl.HeldAtEnd)
			for outcome := range rep.FlowControl.Outcomes {
				assert.Equal(t, "dispatched", outcome, "every held request was served")
			}
		})
	}
}

// TestSessionBodiesConvertToOneChat: a session sent in each -api shape is one
// conversation: the Messages and Responses bodies convert (as vLLM converts them, and
// kvroute with it) to chats whose prompts are the chat completion's.
func TestSessionBodiesConvertToOneChat(t *testing.T) {
	bodies := map[bodyAPI][]byte{}
	for _, api := range []bodyAPI{apiChat, apiMessages, apiResponses} {
		w := defaultOptions().load
		w.api = api
		g := newGenerator(w, 1)
		s := g.newSession("You are\nterse.", 1)
		s.add("user", "first question")
		s.add("assistant", " an answer")
		s.add("user", `a "quoted" one`)
		bodies[api] = s.body()
	}
	lim := openai.DefaultLimits()
	chat, err := openai.Parse(openai.ChatCompletions, bodies[apiChat], lim)
	require.NoError(t, err)
	require.Len(t, chat.Chat.Messages, 4)
	messages, err := openai.MessagesChat(bodies[apiMessages], lim)
	require.NoError(t, err, string(bodies[apiMessages]))
	responses, err := openai.ResponsesChat(bodies[apiResponses], lim)
	require.NoError(t, err, string(bodies[apiResponses]))
	// Encoded by the tokenizer the load test gives kvroute and its workers by default.
	_, cfg, err := kvrouteConfig(nil, []map[string]any{{"name": "w0", "address": "127.0.0.1:9999"}}, "", false)
	require.NoError(t, err)
	set, err := models.Load(cfg.Tokenizers, models.Deps{MaxPromptTokens: cfg.Filter.MaxPromptTokens})
	require.NoError(t, err)
	encode := func(chat *tokenize.Chat, addSpecialTokens *bool) []uint32 {
		enc, err := set.Model("mock").EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat, AddSpecialTokens: addSpecialTokens})
		require.NoError(t, err)
		require.NotEmpty(t, enc.IDs)
		return enc.IDs
	}
	yes := true // vLLM encodes a Responses request's chat with add_special_tokens
	assert.Equal(t, encode(chat.Chat, nil), encode(messages, nil), "Messages: %s", bodies[apiMessages])
	assert.Equal(t, encode(chat.Chat, &yes), encode(responses, &yes), "Responses: %s", bodies[apiResponses])
	parsed, err := openai.ParseResponses(bodies[apiResponses], lim)
	require.NoError(t, err)
	assert.False(t, parsed.Store, "Responses bodies are not stored")
	assert.True(t, parsed.Stream)
}

func TestFailuresNameEachProblem(t *testing.T) {
	clean := func() *report {
		return &report{Requests: 10, BookingsLeft: map[string]float64{"kvroute_scoring_active_requests": 0},
			KvrouteOutcomes: map[string]float64{"routed": 12}}
	}
	tests := []struct {
		name  string
		spoil func(*report)
		want  string
	}{
		{"clean run", func(*report) {}, ""},
		{"a leaked booking", func(r *report) { r.BookingsLeft["kvroute_scoring_active_requests"] = 1 }, "kvroute_scoring_active_requests = 1"},
		{"client errors", func(r *report) {
			r.errors, r.errorExamples = map[string]int64{"status 503": 3}, map[string]string{"status 503": "503 Service Unavailable"}
		}, "3 errors (status 503)"},
		{"nothing answered", func(r *report) { r.Requests = 0 }, "no request completed"},
		{"kvroute died", func(r *report) { r.kvrouteExited = true }, "kvroute exited"},
		{"a kvroute stream error", func(r *report) { r.KvrouteStreamErrs = 2 }, "2 stream errors"},
		{"a recovered panic", func(r *report) { r.KvroutePanics = 1 }, "1 panics"},
		{"a recovered background panic", func(r *report) { r.BackgroundPanics = 2 }, "2 panics in its background loops"},
		{"bodies routed by load", func(r *report) { r.KvrouteOutcomes["load_only"] = 3 }, "3 requests load_only, not routed on their prompt"},
		{"bodies with no room to decode", func(r *report) { r.KvrouteOutcomes["load_only_busy"] = 2 }, "2 requests load_only_busy"},
		{"nothing routed on its prompt", func(r *report) { r.KvrouteOutcomes = map[string]float64{"load_only": 12} }, "routed no request on its prompt"},
		{"hostile bodies with no room to decode", func(r *report) {
			r.opts.hostileStreams, r.KvrouteOutcomes["load_only_busy"] = 1, 2
		}, ""},
		{"bodies unread beside hostile ones", func(r *report) {
			r.opts.hostileStreams, r.KvrouteOutcomes["load_only"] = 1, 2
		}, "2 requests load_only"},
		{"429s without tenants", func(r *report) { r.KvrouteOutcomes["rate_limit_exceeded"] = 4 }, "4 requests rate_limit_exceeded"},
		{"429s retried by tenants", func(r *report) {
			r.opts.load.tenants, r.KvrouteOutcomes["rate_limit_exceeded"] = []tenant{{"a", 2}}, 4
		}, ""},
		{"flow control held nothing at the end", func(r *report) { r.FlowControl = &flowControlReport{HeldMax: 9} }, ""},
		{"flow control still held a request", func(r *report) { r.FlowControl = &flowControlReport{HeldAtEnd: 1} }, "kvroute_flow_control_queued_requests = 1"},
		{"another replica died", func(r *report) { r.others = []replicaEnd{{replica: 1, exited: true}} }, "replica 1 exited"},
		{"another replica leaked", func(r *report) { r.others = []replicaEnd{{replica: 1, bookingsLeft: 2}} }, "replica 1 holds bookings"},
		{"peers exchanged", func(r *report) {
			r.Peers, r.peerReports = true, map[string]float64{"ok": 40}
			r.others = []replicaEnd{{replica: 1, peerReports: map[string]float64{"ok": 38}}}
		}, ""},
		{"a replica heard no peer", func(r *report) {
			r.Peers, r.peerReports = true, map[string]float64{"ok": 40}
			r.others = []replicaEnd{{replica: 1, peerReports: map[string]float64{}}}
		}, "replica 1: peers' reports accepted 0"},
		{"a replica refused reports", func(r *report) {
			r.Peers, r.peerReports = true, map[string]float64{"ok": 40, "refused": 1}
		}, "replica 0: peers' reports accepted 40, refused 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := clean()
			tt.spoil(r)
			got := strings.Join(r.failures(), "\n")
			if tt.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Contains(t, got, tt.want)
		})
	}
}

func TestKvrouteConfigKeepsTheBaseKeys(t *testing.T) {
	workers := []map[string]any{{"name": "w0", "address": "127.0.0.1:9999", "capacity_blocks": 100}}
	raw, cfg, err := kvrouteConfig([]byte("block_size: 16\npolicy: {prefix_affinity_weight: 2}\ngrpc_address: \":9002\"\n"), workers, "", true)
	require.NoError(t, err)
	assert.Equal(t, 16, cfg.Router.BlockSize, "the base's keys stay")
	assert.Equal(t, 2.0, cfg.Policy.PrefixAffinityWeight)
	assert.Equal(t, "127.0.0.1:0", cfg.GRPCAddress, "listeners move to loopback")
	assert.True(t, cfg.AdminPprof)
	require.Len(t, cfg.Router.Workers, 1)
	assert.Equal(t, 100, cfg.Router.Workers[0].CapacityBlocks)
	assert.Contains(t, string(raw), "127.0.0.1:9999")

	_, _, err = kvrouteConfig([]byte("no_such_key: 1\n"), workers, "", false)
	assert.ErrorContains(t, err, "no_such_key", "a bad base config is refused by kvroute's own parser")
}

// TestKvrouteConfigNamesTheDefaultModel: -api sglang's bodies name no model, so kvroute
// gets default_model, the workers' model, unless the base config sets one (its own,
// or "": by load); the other APIs leave it unset.
func TestKvrouteConfigNamesTheDefaultModel(t *testing.T) {
	workers := []map[string]any{{"name": "w0", "address": "127.0.0.1:9999"}}
	model := defaultOptions().load.model
	for _, tt := range []struct {
		name string
		api  bodyAPI
		base string
		want string
	}{
		{"sglang", apiSGLang, "", model},
		{"sglang, the base's", apiSGLang, "default_model: other\n", "other"},
		{"sglang, the base's empty", apiSGLang, "default_model: \"\"\n", ""},
		{"generate", apiGenerate, "", ""},
		{"chat", apiChat, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, cfg, err := kvrouteConfig([]byte(tt.base), workers, tt.api.defaultModel(model), false)
			require.NoError(t, err)
			assert.Equal(t, tt.want, cfg.Filter.DefaultModel)
		})
	}
}

// TestReplicaConfigsListEveryAdminPort: several replicas get admin ports of their own,
// and with peers every replica lists all of them (its own is recognised and skipped).
func TestReplicaConfigsListEveryAdminPort(t *testing.T) {
	workers := []map[string]any{{"name": "w0", "address": "127.0.0.1:9999"}}
	raw, _, err := kvrouteConfig(nil, workers, "", false)
	require.NoError(t, err)
	dir := t.TempDir()
	one, err := replicaConfigs(raw, 1, false, dir)
	require.NoError(t, err)
	assert.Equal(t, [][]byte{raw}, one, "one replica is the config itself")

	raws, err := replicaConfigs(raw, 3, true, dir)
	require.NoError(t, err)
	require.Len(t, raws, 3)
	var admins, secrets []string
	for _, r := range raws {
		cfg, err := config.Parse(r)
		require.NoError(t, err)
		admins = append(admins, cfg.AdminAddress)
		assert.Len(t, cfg.Peers.Addresses, 3)
		assert.Contains(t, cfg.Peers.Addresses, cfg.AdminAddress)
		token, err := cfg.Peers.Token()
		require.NoError(t, err, "a secret kvroute accepts")
		secrets = append(secrets, token)
		assert.Equal(t, "127.0.0.1:9999", cfg.Router.Workers[0].Address)
	}
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(admins))), 3, "an admin port each")
	assert.Len(t, slices.Compact(secrets), 1, "one secret for all")

	raws, err = replicaConfigs(raw, 2, false, dir)
	require.NoError(t, err)
	cfg, err := config.Parse(raws[1])
	require.NoError(t, err)
	assert.False(t, cfg.Peers.Enabled(), "without -peers they do not exchange")
}

func TestHistQuantilesWithinBucketWidth(t *testing.T) {
	var h hist
	for i := 1; i <= 1000; i++ {
		h.observe(time.Duration(i) * time.Microsecond)
	}
	tests := []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}}
	for _, tt := range tests {
		got := h.quantile(tt.q)
		assert.GreaterOrEqual(t, got, tt.want, "q=%v never understates", tt.q)
		assert.LessOrEqual(t, float64(got), float64(tt.want)*histGrowth, "q=%v within one bucket", tt.q)
	}
	assert.Equal(t, time.Millisecond, h.max())
	assert.Equal(t, int64(1000), h.count())
}

func TestPromHistQuantileInterpolates(t *testing.T) {
	// 100 observations: 50 in (0, 1 ms], 50 in (1 ms, 2 ms].
	h := promHist{bounds: []float64{0.001, 0.002, 1e300}, counts: []float64{50, 100, 100}, count: 100, sum: 0.15}
	earlier := promHist{bounds: h.bounds, counts: []float64{0, 0, 0}}
	d := h.since(earlier)
	assert.Equal(t, time.Millisecond, d.quantile(0.5))
	assert.InDelta(t, float64(1900*time.Microsecond), float64(d.quantile(0.95)), float64(time.Microsecond))
	assert.Equal(t, 1500*time.Microsecond, d.mean())
}

func TestOptionsAreBounded(t *testing.T) {
	requireValidation(t, []optionsCase{
		{"defaults", func(*options) {}, ""},
		{"no streams", func(o *options) { o.streams = 0 }, "-streams"},
		{"too many streams", func(o *options) { o.streams = 20001 }, "-streams"},
		{"unbounded duration", func(o *options) { o.duration = 25 * time.Hour }, "-duration"},
		{"warm-up as long as the run", func(o *options) { o.warmup = o.duration }, "-warmup"},
		{"prompts that cannot grow", func(o *options) { o.load.maxPromptTokens = o.load.prefixTokens }, "-max-prompt-tokens"},
		{"no replica", func(o *options) { o.replicas = 0 }, "-replicas"},
		{"peers without replicas", func(o *options) { o.peers = true }, "-peers"},
		{"messages", func(o *options) { o.load.api = apiMessages }, ""},
		{"responses", func(o *options) { o.load.api = apiResponses }, ""},
		{"generate", func(o *options) { o.load.api = apiGenerate }, ""},
		{"sglang", func(o *options) { o.load.api = apiSGLang }, ""},
		{"an unknown API", func(o *options) { o.load.api = "completions" }, "-api"},
		{"samples of generate", func(o *options) { o.load.api, o.load.samples = apiGenerate, 8 }, ""},
		{"no samples", func(o *options) { o.load.samples = 0 }, "-samples"},
		{"samples of a chat", func(o *options) { o.load.samples = 8 }, "-samples"},
		{"samples past max-num-seqs", func(o *options) { o.load.api, o.load.samples, o.maxNumSeqs = apiGenerate, 8, 4 }, "-samples"},
	})
}

func TestContentReadsPlainAndEscapedChunks(t *testing.T) {
	tests := []struct {
		name, payload, want string
	}{
		{"plain", `{"choices":[{"delta":{"content":" abc"}}]}`, " abc"},
		{"escaped", `{"choices":[{"delta":{"content":"a\"b\u00e9"}}]}`, `a"bé`},
		{"role only", `{"choices":[{"delta":{"role":"assistant"}}]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := content([]byte(tt.payload))
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
		})
	}
}

func TestOutputIDsReadPlainAndSpacedChunks(t *testing.T) {
	tests := []struct {
		name, payload, want string
	}{
		{"plain", `{"request_id":"r","choices":[{"index":0,"finish_reason":null,"token_ids":[17,4096],"routed_experts":null}],"usage":null}`, ",17,4096"},
		{"spaced", `{"request_id":"r","choices":[{"index":0,"token_ids":[ 17, 4096 ]}],"usage":null}`, ",17,4096"},
		{"empty", `{"request_id":"r","choices":[{"index":0,"token_ids":[]}],"usage":null}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := outputIDs([]byte(tt.payload))
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
		})
	}
	_, err := outputIDs([]byte(`{"request_id":"r","choices":[{"index":0}]}`))
	assert.Error(t, err, "a chunk without token_ids")
}

func TestChoiceIndexReadsPlainAndSpacedChunks(t *testing.T) {
	for payload, want := range map[string]int{
		`{"request_id":"r","choices":[{"index":0,"token_ids":[1]}],"usage":null}`:      0,
		`{"request_id":"r","choices":[{"index":13,"token_ids":[1]}],"usage":null}`:     13,
		`{"request_id":"r", "choices": [ {"token_ids":[1], "index": 7}],"usage":null}`: 7,
	} {
		got, err := choiceIndex([]byte(payload))
		require.NoError(t, err, payload)
		assert.Equal(t, want, got, payload)
	}
	_, err := choiceIndex([]byte(`{"request_id":"r","choices":[{"token_ids":[1]}]}`))
	assert.Error(t, err, "a chunk without an index")
}

// TestGenerateSessionsResendTheirEpisode runs one generate stream against a mockworker
// directly: the first turn's token_ids are -prefix-tokens plus -user-tokens ids below
// generateVocabulary, and each later turn's are the previous turn's, the output ids the
// worker streamed back, and -user-tokens new ones; the worker finds the episode cached.
func TestGenerateSessionsResendTheirEpisode(t *testing.T) {
	testEpisodesResent(t, apiGenerate, 1, generateIDs, func(t *testing.T, sse []byte) []int64 { return choiceIDs(t, sse, 1) })
}

// TestSGLangSessionsResendTheirEpisode is TestGenerateSessionsResendTheirEpisode for
// SGLang's /generate: input_ids grow by the output ids once, though every chunk of the
// stream repeats the ids before it (the last chunk's output_ids are the output).
func TestSGLangSessionsResendTheirEpisode(t *testing.T) {
	testEpisodesResent(t, apiSGLang, 1, sglangIDs, sglangStreamedIDs)
}

// TestGenerateSamplesGoOnFromChoiceZero is TestGenerateSessionsResendTheirEpisode with
// -samples 4: each body asks for n 4, and the episode goes on from choice 0's output
// ids alone; the figures stay per request (one TTFT a request, the prompt and its
// cached tokens counted once), while the chunks of every sample count.
func TestGenerateSamplesGoOnFromChoiceZero(t *testing.T) {
	const samples = 4
	m, bodies := testEpisodesResent(t, apiGenerate, samples, func(t *testing.T, body []byte) []int64 {
		var b struct {
			SamplingParams struct {
				N int `json:"n"`
			} `json:"sampling_params"`
		}
		require.NoError(t, json.Unmarshal(body, &b))
		assert.Equal(t, samples, b.SamplingParams.N)
		return generateIDs(t, body)
	}, func(t *testing.T, sse []byte) []int64 { return choiceIDs(t, sse, samples) })
	assert.Equal(t, m.completed.Load(), m.ttft.count(), "one TTFT a request")
	assert.GreaterOrEqual(t, m.chunks.Load(), samples*m.completed.Load(), "every sample's chunks")
	var prompt int64
	for _, b := range bodies {
		prompt += int64(len(generateIDs(t, b)))
	}
	assert.Equal(t, prompt, m.promptTok.Load(), "each request's prompt once")
	assert.Less(t, m.cachedTok.Load(), prompt)
}

// choiceIDs checks a generate stream of samples choices (each chunk one choice, every
// index streamed) and returns choice 0's output ids.
func choiceIDs(t *testing.T, sse []byte, samples int) []int64 {
	t.Helper()
	byIndex := map[int][]int64{}
	for line := range strings.Lines(string(sse)) {
		payload, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Index    int     `json:"index"`
				TokenIDs []int64 `json:"token_ids"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(payload), &chunk), payload)
		for _, c := range chunk.Choices {
			byIndex[c.Index] = append(byIndex[c.Index], c.TokenIDs...)
		}
	}
	require.Len(t, byIndex, samples)
	return byIndex[0]
}

// testEpisodesResent runs one stream of a token-in api, samples parallel samples a
// request, against a mockworker directly: the first turn's ids (read from its body by
// promptIDs) are -prefix-tokens plus -user-tokens ids below generateVocabulary, and
// each later turn's are the previous turn's, the output ids the worker streamed back
// (choice 0's, read from its response by outputIDs), and -user-tokens new ones; the
// worker finds the episode cached. It returns the measurement and the bodies sent.
func testEpisodesResent(t *testing.T, api bodyAPI, samples int, promptIDs func(*testing.T, []byte) []int64, outputIDs func(*testing.T, []byte) []int64) (*measured, [][]byte) {
	const turns = 3
	w := defaultOptions().load
	w.api, w.samples = api, samples
	w.prefixTokens, w.userTokens, w.maxPromptTokens, w.outputTokens = 64, 8, 10000, 4
	worker, err := mockworker.New(mockworker.Config{Name: "w0", Speed: 1000, DefaultMaxTokens: 16, Seed: 1,
		Engine: sim.Config{BlockSize: 16, MaxNumSeqs: max(2, samples), NumGPUBlocks: 4096, MaxBatchedTokens: 8192}})
	require.NoError(t, err)
	defer worker.Close()
	type exchange struct{ body, response []byte }
	exchanges := make(chan exchange, turns+2)
	h := worker.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		tee := &teeWriter{ResponseWriter: rw}
		h.ServeHTTP(tee, r)
		exchanges <- exchange{body, tee.buf.Bytes()}
	}))
	defer srv.Close()

	g := newGenerator(w, 1)
	g.urls = []string{srv.URL}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.stream(ctx, context.Background(), 0) }()
	var got []exchange
	for range turns {
		got = append(got, <-exchanges)
	}
	cancel()
	<-done
	assert.Zero(t, g.errorCount(), "errors: %v", g.errs)

	prev := promptIDs(t, got[0].body)
	assert.Len(t, prev, w.prefixTokens+w.userTokens)
	for _, id := range prev {
		assert.Less(t, id, int64(generateVocabulary))
	}
	for k := 1; k < len(got); k++ {
		ids := promptIDs(t, got[k].body)
		output := outputIDs(t, got[k-1].response)
		require.Len(t, output, w.outputTokens)
		require.Len(t, ids, len(prev)+len(output)+w.userTokens)
		assert.Equal(t, prev, ids[:len(prev)], "the previous turn's ids first")
		assert.Equal(t, output, ids[len(prev):len(prev)+len(output)], "then the output ids streamed back")
		prev = ids
	}
	m := g.cur.Load()
	assert.Positive(t, m.cachedTok.Load(), "later turns find the episode cached")
	assert.Positive(t, m.promptTok.Load())
	assert.GreaterOrEqual(t, m.ttft.count(), int64(turns))
	// The bodies of every request measured: the stream may have finished one more
	// after the turns read.
	for int64(len(got)) < m.completed.Load() {
		select {
		case e := <-exchanges:
			got = append(got, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d exchanges seen, %d requests completed", len(got), m.completed.Load())
		}
	}
	bodies := make([][]byte, len(got))
	for i, e := range got {
		bodies[i] = e.body
	}
	return m, bodies
}

// teeWriter copies a response as it is written.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// generateIDs is a generate body's token_ids, checked for the fields a rollout sends.
func generateIDs(t *testing.T, body []byte) []int64 {
	t.Helper()
	var b struct {
		Model          string  `json:"model"`
		Stream         bool    `json:"stream"`
		TokenIDs       []int64 `json:"token_ids"`
		SamplingParams struct {
			MaxTokens int `json:"max_tokens"`
		} `json:"sampling_params"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	require.NoError(t, json.Unmarshal(body, &b), string(body))
	assert.True(t, b.Stream && b.StreamOptions.IncludeUsage, "streamed with usage")
	assert.Equal(t, defaultOptions().load.model, b.Model)
	assert.Equal(t, 4, b.SamplingParams.MaxTokens)
	return b.TokenIDs
}

// sglangIDs is an SGLang /generate body's input_ids, checked for the fields a rollout
// sends: stream, max_new_tokens, and no model.
func sglangIDs(t *testing.T, body []byte) []int64 {
	t.Helper()
	var b struct {
		Model          *string `json:"model"`
		Stream         bool    `json:"stream"`
		InputIDs       []int64 `json:"input_ids"`
		SamplingParams struct {
			MaxNewTokens int `json:"max_new_tokens"`
		} `json:"sampling_params"`
	}
	require.NoError(t, json.Unmarshal(body, &b), string(body))
	assert.True(t, b.Stream, "streamed")
	assert.Nil(t, b.Model, "SGLang's body names no model")
	assert.Equal(t, 4, b.SamplingParams.MaxNewTokens)
	parsed, err := openai.Parse(openai.SGLangGenerate, body, openai.DefaultLimits())
	require.NoError(t, err, "kvroute reads the body")
	require.Len(t, parsed.Tokens, len(b.InputIDs), "kvroute routes on the input_ids")
	return b.InputIDs
}

// sglangStreamedIDs are the output ids of an SGLang stream: each chunk holds every id
// so far, so the last chunk's (which has a finish_reason); the earlier chunks' must
// be its prefixes.
func sglangStreamedIDs(t *testing.T, sse []byte) []int64 {
	t.Helper()
	var ids []int64
	finished := false
	for line := range strings.Lines(string(sse)) {
		payload, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var chunk struct {
			OutputIDs []int64 `json:"output_ids"`
			MetaInfo  struct {
				FinishReason any `json:"finish_reason"`
			} `json:"meta_info"`
		}
		require.NoError(t, json.Unmarshal([]byte(payload), &chunk), payload)
		require.False(t, finished, "a chunk after the finished one")
		require.GreaterOrEqual(t, len(chunk.OutputIDs), len(ids))
		if len(ids) > 0 {
			assert.Equal(t, ids, chunk.OutputIDs[:len(ids)], "a chunk's ids extend the one's before")
		}
		ids, finished = chunk.OutputIDs, chunk.MetaInfo.FinishReason != nil
	}
	require.True(t, finished, "the stream's last chunk has a finish_reason")
	return ids
}

// TestSGLangStreamTakesEachOutputIDOnce: an SGLang stream's chunks repeat every id so
// far; each is read once, the usage is the last chunk's meta_info, and [DONE] ends the
// stream only after a finished chunk. An error chunk, shrinking ids or a chunk that is
// not SGLang's fail the request.
func TestSGLangStreamTakesEachOutputIDOnce(t *testing.T) {
	chunk := func(ids string, cached int, finish string) []byte {
		return []byte(fmt.Sprintf(`{"text":"x","output_ids":[%s],"meta_info":{"id":"r","finish_reason":%s,"prompt_tokens":40,"completion_tokens":1,"cached_tokens":%d}}`, ids, finish, cached))
	}
	var s sglangStream
	var res result
	var text []byte
	for _, c := range [][]byte{chunk("7", 16, "null"), chunk("7,8", 16, "null"), chunk("7, 8, 9", 32, `{"type":"length","length":3}`)} {
		step, err := s.event(c, &res)
		require.NoError(t, err, string(c))
		assert.True(t, step.delta)
		assert.False(t, step.done)
		text = append(text, step.text...)
	}
	assert.Equal(t, ",7,8,9", string(text), "each id once")
	assert.Equal(t, int64(40), res.promptTokens)
	assert.Equal(t, int64(32), res.cachedTokens, "the last chunk's cached_tokens")
	step, err := s.event([]byte("[DONE]"), &res)
	require.NoError(t, err)
	assert.True(t, step.done)

	for _, tt := range []struct {
		name   string
		chunks [][]byte
		class  string
	}{
		{"error chunk", [][]byte{[]byte(`{"error":{"message":"The input (9 tokens) is longer than the model's context length"}}`)}, "stream error"},
		{"done unfinished", [][]byte{chunk("7", 0, "null"), []byte("[DONE]")}, "truncated"},
		{"ids shrink", [][]byte{chunk("7,8", 0, "null"), chunk("7", 0, "null")}, "bad chunk"},
		{"a vLLM chunk", [][]byte{[]byte(`{"choices":[{"token_ids":[7]}]}`)}, "bad chunk"},
		{"not JSON", [][]byte{[]byte(`{"output_ids":[7`)}, "bad chunk"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s sglangStream
			var step streamStep
			var err error
			for _, c := range tt.chunks {
				if step, err = s.event(c, &result{}); err != nil {
					break
				}
			}
			require.Error(t, err)
			assert.Equal(t, tt.class, step.class)
		})
	}
}

func TestSharedPrefixGivesEverySessionOneSystemPrompt(t *testing.T) {
	for _, api := range []bodyAPI{apiChat, apiGenerate, apiSGLang} {
		for _, shared := range []bool{false, true} {
			w := defaultOptions().load
			w.api, w.sharedPrefix = api, shared
			g := newGenerator(w, 2)
			first := g.systemPrompt(rand.New(rand.NewPCG(w.seed, 0)))
			second := g.systemPrompt(rand.New(rand.NewPCG(w.seed, 1)))
			tokens := strings.Fields(first)
			if api.tokenIn() {
				tokens = strings.Split(first, ",")
			}
			assert.Equal(t, w.prefixTokens, len(tokens), "%s: the prompt has -prefix-tokens one-token words or ids", api)
			assert.Equal(t, shared, first == second, "%s, shared %v: two streams' sessions open with the same prompt", api, shared)
		}
	}
}

func TestPerWorkerCountsEveryWorkerStarted(t *testing.T) {
	tests := []struct {
		name        string
		served      []string
		workers     int
		maxOverMean float64
	}{
		{"even", []string{"w0", "w1", "w0", "w1"}, 2, 1},
		{"a worker that answered nothing counts in the mean", []string{"w0", "w0", "w1", "w0"}, 4, 3},
		{"nothing answered", nil, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &measured{}
			for _, w := range tt.served {
				m.served(w)
			}
			counts, got := m.perWorker(tt.workers)
			assert.InDelta(t, tt.maxOverMean, got, 1e-9)
			assert.Equal(t, int64(len(tt.served)), sum(counts))
		})
	}
}

// optionsCase is an edit of the default options and the flag its error must name ("":
// valid).
type optionsCase struct {
	name string
	edit func(*options)
	want string
}

// requireValidation checks each case's options against options.validate.
func requireValidation(t *testing.T, tests []optionsCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaultOptions()
			tt.edit(&o)
			err := o.validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestParseBodyAPIListsEveryAPI: an unknown -api is refused naming every one there is.
func TestParseBodyAPIListsEveryAPI(t *testing.T) {
	for _, api := range bodyAPIs {
		got, err := parseBodyAPI(string(api))
		require.NoError(t, err)
		assert.Equal(t, api, got)
	}
	_, err := parseBodyAPI("completions")
	assert.EqualError(t, err, `-api: unknown API "completions" (want chat, messages, responses, generate, sglang or sglang-session)`)
}
