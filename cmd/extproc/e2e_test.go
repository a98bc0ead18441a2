package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// deployment is kvroute as users run it: extproc (the real wiring) beside a test data
// plane, in front of fake OpenAI workers.
type deployment struct {
	app      *app
	grpcAddr string
	adminURL string // https:// with admin_tls
	// admin is the client of the admin port; nil is http.DefaultClient (admin_tls
	// needs one that trusts its CA, with a client certificate for mTLS).
	admin *http.Client
	// healthAddr is the plaintext gRPC health listener, when health_address is set.
	healthAddr string
	envoy      *envoytest.Server
	workers    map[string]*fakeworker.Worker
	byAddress  map[string]string
	client     openai.Client
	stop       func()

	log *slog.Logger

	// next is what the config file holds for the next reload (postReload sets it).
	nextMu  sync.Mutex
	next    config.Config
	loadErr error
}

// load is the deployment's config file: what postReload last put there.
func (d *deployment) load() (config.Config, error) {
	d.nextMu.Lock()
	defer d.nextMu.Unlock()
	if d.loadErr != nil {
		return config.Config{}, d.loadErr
	}
	return d.next, d.next.Validate()
}

func deploy(t *testing.T, reqMode, respMode extprocfilterv3.ProcessingMode_BodySendMode, edit func(*config.Config)) *deployment {
	t.Helper()
	return deployLogging(t, reqMode, respMode, edit, discardLogger())
}

// deployLogging is deploy with kvroute logging to log.
func deployLogging(t *testing.T, reqMode, respMode extprocfilterv3.ProcessingMode_BodySendMode, edit func(*config.Config), log *slog.Logger) *deployment {
	t.Helper()
	return deployEnvoy(t, reqMode, respMode, edit, nil, log)
}

// deployEnvoy is deployLogging with the data plane's config edited before it starts.
func deployEnvoy(t *testing.T, reqMode, respMode extprocfilterv3.ProcessingMode_BodySendMode, edit func(*config.Config),
	editEnvoy func(*envoytest.Config), log *slog.Logger) *deployment {
	t.Helper()
	cfg := config.Default()
	cfg.Router.BlockSize = 4
	cfg.ShutdownGrace = 2 * time.Second
	// The fake workers tokenize nothing, and loading the embedded tokenizer costs
	// seconds under the race detector: these deployments use the approximate pair.
	// tokenize_e2e_test.go runs the embedded default.
	cfg.Tokenizers = approxTokenizersConfig()
	// The fake workers record every request they answer, and the tests count them:
	// reads of their model lists would count too (adapterlists_e2e_test.go reads them).
	cfg.EngineModels.Interval = 0
	cfg.Filter.RequestBodyMode = filter.BodyMode(modeName(reqMode))
	cfg.Filter.ResponseBodyMode = filter.BodyMode(modeName(respMode))
	d := &deployment{workers: map[string]*fakeworker.Worker{}, byAddress: map[string]string{}}
	for i := range 3 {
		w := fakeworker.New(fmt.Sprintf("w%d", i))
		t.Cleanup(w.Close)
		d.workers[w.Name] = w
		d.byAddress[w.Address] = w.Name
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: w.Name, Address: w.Address, Models: []string{"qwen"}})
	}
	if edit != nil {
		edit(&cfg)
	}
	require.NoError(t, cfg.Validate())
	d.next, d.log = cfg, log
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d.serve(t, grpcLn, adminLn)
	d.startEnvoy(t, reqMode, respMode, editEnvoy)
	return d
}

// startEnvoy starts the test data plane in front of the served kvroute.
func (d *deployment) startEnvoy(t *testing.T, reqMode, respMode extprocfilterv3.ProcessingMode_BodySendMode, editEnvoy func(*envoytest.Config)) {
	t.Helper()
	mode := &extprocfilterv3.ProcessingMode{RequestBodyMode: reqMode, ResponseBodyMode: respMode}
	if reqMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		mode.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
		mode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	ecfg := envoytest.Config{
		ProcessorAddress: d.grpcAddr, ProcessingMode: mode, SendProtocolConfig: true,
		MessageTimeout: time.Minute, ReceivingNamespaces: []string{"envoy.lb"},
		DestinationHeader: d.next.Filter.DestinationHeader,
	}
	if editEnvoy != nil {
		editEnvoy(&ecfg)
	}
	d.envoy = envoytest.NewServer(ecfg)
	t.Cleanup(func() { assert.NoError(t, d.envoy.Close()) })
	d.client = openai.NewClient(option.WithBaseURL(d.envoy.URL+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
}

// serve builds kvroute from the deployment's config and serves it on the listeners;
// d.stop drains it.
func (d *deployment) serve(t *testing.T, grpcLn, adminLn net.Listener) {
	t.Helper()
	a, err := build(d.next, d.load, d.log)
	require.NoError(t, err)
	if a.process.PlainHealth != nil {
		a.process.PlainHealthListener, err = net.Listen("tcp", d.next.HealthAddress)
		require.NoError(t, err)
		d.healthAddr = a.process.PlainHealthListener.Addr().String()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.process.Serve(ctx, grpcLn, adminLn) }()
	scheme := "http://"
	if d.next.AdminTLS.Enabled() {
		scheme = "https://"
	}
	d.app, d.grpcAddr, d.adminURL = a, grpcLn.Addr().String(), scheme+adminLn.Addr().String()
	d.stop = func() {
		cancel()
		require.NoError(t, <-done)
	}
}

func modeName(m extprocfilterv3.ProcessingMode_BodySendMode) string {
	return extprocfilterv3.ProcessingMode_BodySendMode_name[int32(m)]
}

// scrape reads the admin port's /metrics.
func (d *deployment) scrape(t *testing.T) string {
	t.Helper()
	resp, err := d.adminClient().Get(d.adminURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// adminClient is the client of the admin port.
func (d *deployment) adminClient() *http.Client {
	if d.admin != nil {
		return d.admin
	}
	return http.DefaultClient
}

// gaugeSum adds a gauge family's series on the admin port's /metrics.
func (d *deployment) gaugeSum(t *testing.T, name string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(d.scrape(t)))
	require.NoError(t, err)
	f, ok := families[name]
	require.True(t, ok, "%s is exported", name)
	total := 0.0
	for _, m := range f.GetMetric() {
		total += m.GetGauge().GetValue()
	}
	return total
}

func (d *deployment) requireNoLoad(t *testing.T) {
	t.Helper()
	metrics := d.scrape(t)
	for name := range d.workers {
		for _, g := range []string{"kvroute_scoring_active_requests", "kvroute_scoring_active_blocks", "kvroute_scoring_prefill_tokens", "kvroute_scoring_pending_requests"} {
			assert.Contains(t, metrics, fmt.Sprintf("%s{worker=%q} 0\n", g, name))
		}
	}
}

var e2eModes = []struct {
	name      string
	req, resp extprocfilterv3.ProcessingMode_BodySendMode
}{
	{"BUFFERED requests, STREAMED responses", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED},
	{"FULL_DUPLEX_STREAMED both ways", extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
}

func TestOpenAIClientThroughEnvoyAndKvroute(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, nil)
			defer d.stop()
			ctx := context.Background()
			system := openai.SystemMessage(strings.Repeat("You answer questions about the routing of LLM requests. ", 12))

			chat, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{system, openai.UserMessage("What is a KV cache?")},
			})
			require.NoError(t, err)
			require.Len(t, chat.Choices, 1)
			holder := strings.TrimPrefix(chat.Choices[0].Message.Content, "hello from ")
			// The client may have its answer before kvroute has seen the stream end and
			// released the booking; a booking still on the holder would rightly count
			// against it in the next decision.
			require.Eventually(t, func() bool { return d.gaugeSum(t, "kvroute_scoring_active_requests") == 0 },
				time.Minute, 5*time.Millisecond, "the first request's booking is released")

			stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{system, openai.UserMessage("What is a KV cache?"),
					openai.AssistantMessage("A cache of attention keys and values."), openai.UserMessage("Why route by it?")},
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			var text strings.Builder
			var cached int64
			for stream.Next() {
				c := stream.Current()
				if len(c.Choices) > 0 {
					text.WriteString(c.Choices[0].Delta.Content)
				}
				cached = max(cached, c.Usage.PromptTokensDetails.CachedTokens)
			}
			require.NoError(t, stream.Err())
			assert.Equal(t, "t0 t1 t2 ", text.String(), "SSE chunks arrive unchanged")
			assert.Equal(t, int64(4), cached, "usage passes through")

			completion, err := d.client.Completions.New(ctx, openai.CompletionNewParams{
				Model: "qwen", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			})
			require.NoError(t, err)
			assert.Contains(t, completion.Choices[0].Text, "hello from")

			cstream := d.client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
				Model: "qwen", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3, 4, 5, 6, 7, 8}},
			})
			chunks := 0
			for cstream.Next() {
				chunks++
			}
			require.NoError(t, cstream.Err())
			assert.Equal(t, 4, chunks)

			// The worker that served each request is the one kvroute named, and the
			// resumed conversation went back to the holder of its prefix.
			exchanges := d.envoy.Exchanges()
			require.Len(t, exchanges, 4)
			for _, ex := range exchanges {
				named := ex.DynamicMetadata["envoy.lb"].Fields["x-gateway-destination-endpoint"].GetStringValue()
				assert.Equal(t, named, ex.Upstream)
				assert.Equal(t, 200, ex.Status)
			}
			// Exchanges are recorded as their streams end, not in request order.
			chats := 0
			for _, ex := range exchanges {
				if ex.Path == "/v1/chat/completions" {
					chats++
					assert.Equal(t, holder, d.byAddress[ex.Upstream], "the conversation and its resumption went to its holder")
				}
			}
			assert.Equal(t, 2, chats)
			served := 0
			for _, w := range d.workers {
				served += len(w.Served())
			}
			assert.Equal(t, 4, served)
			d.requireNoLoad(t)
		})
	}
}

func TestBadInputThroughTheWholePath(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, func(c *config.Config) { c.Filter.MaxBodyBytes = 2048 })
			defer d.stop()
			ctx := context.Background()
			tests := []struct {
				name   string
				call   func() error
				status int
				code   string
			}{
				{"model nobody serves", func() error {
					_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "llama", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
					return err
				}, 404, "model_not_found"},
				{"empty messages", func() error {
					_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{}})
					return err
				}, 400, "invalid_request"},
				{"body over max_body_bytes", func() error {
					_, err := d.client.Completions.New(ctx, openai.CompletionNewParams{Model: "qwen", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("long ", 1000))}})
					return err
				}, 413, "request_too_large"},
				{"malformed JSON", func() error {
					return d.client.Post(ctx, "chat/completions", []byte(`{"model":"qwen","messages":[`), nil)
				}, 400, "invalid_request"},
				{"upstream failure passes through", func() error {
					_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("FAIL_UPSTREAM")}})
					return err
				}, 503, ""},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					var apiErr *openai.Error
					require.True(t, errors.As(tt.call(), &apiErr))
					assert.Equal(t, tt.status, apiErr.StatusCode)
					assert.Equal(t, tt.code, apiErr.Code)
					assert.NotEmpty(t, apiErr.Message)
				})
			}
			// Still serving, and nothing is left booked.
			_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("fine")}})
			require.NoError(t, err)
			d.requireNoLoad(t)
		})
	}
}

func TestHealthMetricsAndGracefulShutdown(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil)
	conn, err := grpc.NewClient(d.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range server.HealthServices {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err)
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.Status, svc)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(d.adminURL + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, path)
	}
	_, err = d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	require.NoError(t, err)
	metrics := d.scrape(t)
	for _, name := range []string{"kvroute_filter_requests_total", "kvroute_filter_decision_duration_seconds", "kvroute_index_entries", "kvroute_filter_completions_total", "kvroute_session_entries"} {
		assert.Contains(t, metrics, name)
	}
	problems, err := testutil.GatherAndLint(d.app.registry)
	require.NoError(t, err)
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "kvroute_") {
			t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
		}
	}

	// A generation in flight when SIGTERM arrives: health turns NOT_SERVING, the
	// stream is cut after shutdown_grace, and its booking is released.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("HANG_AFTER_FIRST_TOKEN")}})
	require.True(t, stream.Next())
	assert.Equal(t, 1.0, d.gaugeSum(t, "kvroute_scoring_active_requests"), "the generation in flight is booked")
	d.stop()
	assert.False(t, d.app.process.Ready())
	assert.Equal(t, 0, func() int {
		n := 0
		for name := range d.workers {
			n += d.app.bookings.Load(name).ActiveRequests
		}
		return n
	}(), "bookings released when the stream was cut")
	cancel()
}
