package filter_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// worker wraps a fake upstream for these tests.
type worker struct {
	*fakeworker.Worker
	name string
}

func newWorker(t *testing.T, name string) *worker {
	t.Helper()
	w := fakeworker.New(name)
	t.Cleanup(w.Close)
	return &worker{Worker: w, name: name}
}

func (w *worker) address() string { return w.Address }

func (w *worker) count() int { return len(w.Served()) }

// plane is kvroute's filter behind a test data plane, with fake workers.
type plane struct {
	grpcAddr string
	envoy    *envoytest.Server
	workers  []*worker
	bookings *scoring.Bookings
	index    *index.Index
	registry *prometheus.Registry
	explain  *explain.Recorder
}

type planeOptions struct {
	workers    int
	models     [][]string // per worker; nil: every model
	roles      []string   // per worker (router.Worker.Role); nil: every worker a destination
	params     scoring.Params
	filterCfg  func(*filter.Config)
	envoyCfg   func(*envoytest.Config)
	logger     *slog.Logger
	wrapRouter func(filter.Router) filter.Router // e.g. a Router that stalls
	reqMode    extprocfilterv3.ProcessingMode_BodySendMode
	respMode   extprocfilterv3.ProcessingMode_BodySendMode
	noProtocol bool
	explain    explain.Config // zero: explain's defaults with sampling off
	sessions   bool           // remember sessions by x-session-id
	responses  bool           // remember which worker stored each Responses API response
	// responsesNow, when set with responses, is that store's clock (its TTL's).
	responsesNow func() time.Time
	health       filter.StatusObserver
	tokenizers   router.Tokenizers // nil: Approx and ChatML for every model
	// objectiveHeader is the filter's objective header ("": none read); objectives, when
	// not nil, the router's objective table, with GIE's saturation rule over engineLoad.
	objectiveHeader string
	objectives      map[string]int
	engineLoad      router.EngineLoad
	// fairnessHeader is flow control's fairness header, read as with flow control on
	// ("": none read).
	fairnessHeader string
	// rewrites, when set, chooses requests' target models.
	rewrites filter.ModelRewriter
	// loras are the router's lora_adapters.
	loras []router.LoRAAdapter
	// maxModelLen are the workers' contexts (router.Worker.MaxModelLen); nil: unknown.
	maxModelLen []int
}

func newPlane(t *testing.T, o planeOptions) *plane {
	t.Helper()
	if o.workers == 0 {
		o.workers = 2
	}
	if o.params == (scoring.Params{}) {
		o.params = scoring.DynamoParams()
	}
	// NONE is the zero mode: only a plane that names neither mode gets the defaults, so
	// NONE in one direction is honoured.
	if o.reqMode == 0 && o.respMode == 0 {
		o.reqMode, o.respMode = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED
	}
	p := &plane{bookings: scoring.NewBookings(), registry: prometheus.NewRegistry()}
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	p.index = idx
	var workers []router.Worker
	for i := range o.workers {
		w := newWorker(t, fmt.Sprintf("w%d", i))
		p.workers = append(p.workers, w)
		rw := router.Worker{Name: w.name, Address: w.address()}
		if i < len(o.models) {
			rw.Models = o.models[i]
		}
		if i < len(o.roles) {
			rw.Role = o.roles[i]
		}
		if i < len(o.maxModelLen) {
			rw.MaxModelLen = o.maxModelLen[i]
		}
		workers = append(workers, rw)
		require.NoError(t, idx.SetWorker(w.name, 0))
	}
	policy, err := scoring.NewPolicy(o.params)
	require.NoError(t, err)
	picker := scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 2)))
	deps := router.Deps{
		Tokenizers: o.tokenizers, Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx,
		Bookings: p.bookings, Picker: picker, RecordBlocks: true, Policy: policy, Metrics: router.NewMetrics(p.registry),
	}
	if o.objectives != nil {
		deps.Objectives, deps.Saturation, deps.EngineLoad = priority.NewObjectives(o.objectives), priority.DefaultConfig().Saturation(), o.engineLoad
	}
	var sessionHeaders []string
	if o.sessions {
		store, err := session.New(session.DefaultConfig(), nil)
		require.NoError(t, err)
		deps.Sessions, sessionHeaders = store, session.DefaultConfig().Headers()
	}
	if o.responses {
		store, err := session.NewResponses(session.DefaultResponsesConfig(), o.responsesNow)
		require.NoError(t, err)
		deps.Responses = store
	}
	r, err := router.New(router.Config{BlockSize: 4, Workers: workers, LoRAAdapters: o.loras}, deps)
	require.NoError(t, err)
	if o.explain == (explain.Config{}) {
		o.explain = explain.DefaultConfig()
		o.explain.SampleRate = 0
	}
	p.explain, err = explain.New(o.explain, nil)
	require.NoError(t, err)

	fcfg := filter.DefaultConfig()
	fcfg.RequestBodyMode = modeName(o.reqMode)
	fcfg.ResponseBodyMode = modeName(o.respMode)
	if o.filterCfg != nil {
		o.filterCfg(&fcfg)
	}
	var fr filter.Router = r
	if o.wrapRouter != nil {
		fr = o.wrapRouter(r)
	}
	fs, err := filter.New(fcfg, filter.Deps{Router: fr, Policy: policy, Metrics: filter.NewMetrics(p.registry), Logger: o.logger,
		Explain: p.explain, SessionHeaders: sessionHeaders, Health: o.health, ObjectiveHeaders: priority.Config{Header: o.objectiveHeader}.Headers(),
		FairnessHeaders: flowcontrol.Config{Enabled: true, FairnessHeader: o.fairnessHeader}.Headers(), Rewrites: o.rewrites})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer(server.Options(fcfg.MaxBodyBytes)...)
	extprocv3.RegisterExternalProcessorServer(gs, fs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	p.grpcAddr = ln.Addr().String()

	ecfg := envoytest.Config{
		ProcessorAddress:   ln.Addr().String(),
		ProcessingMode:     &extprocfilterv3.ProcessingMode{RequestBodyMode: o.reqMode, ResponseBodyMode: o.respMode},
		SendProtocolConfig: !o.noProtocol,
		// Envoy's timer, set long enough that a saturated machine never trips it.
		MessageTimeout:      time.Minute,
		ReceivingNamespaces: []string{"envoy.lb"},
		DestinationHeader:   fcfg.DestinationHeader,
	}
	if o.reqMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		ecfg.ProcessingMode.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if o.respMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		ecfg.ProcessingMode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	}
	if o.envoyCfg != nil {
		o.envoyCfg(&ecfg)
	}
	p.envoy = envoytest.NewServer(ecfg)
	t.Cleanup(func() { require.NoError(t, p.envoy.Close()) })
	return p
}

func modeName(m extprocfilterv3.ProcessingMode_BodySendMode) filter.BodyMode {
	return filter.BodyMode(extprocfilterv3.ProcessingMode_BodySendMode_name[int32(m)])
}

func (p *plane) post(t *testing.T, path, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.envoy.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := p.envoy.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, sb.String()
}

func (p *plane) idle() bool {
	for _, w := range p.workers {
		if p.bookings.Load(w.name) != (scoring.Load{}) {
			return false
		}
	}
	return true
}

// requireIdle asserts every worker's booked load is back to zero. The last reply of a
// stream is sent after its release, so a finished response needs no waiting.
func (p *plane) requireIdle(t *testing.T) {
	t.Helper()
	require.True(t, p.idle(), "bookings did not return to zero")
}

// waitIdle waits for releases that happen asynchronously (a client cancel reaches the
// processor as a stream cancel, after the client has gone).
func (p *plane) waitIdle(t *testing.T) {
	t.Helper()
	require.Eventually(t, p.idle, 10*time.Second, 2*time.Millisecond, "bookings did not return to zero")
}

// book puts an unrelated in-flight request of n blocks on a worker and returns its release.
func (p *plane) book(t *testing.T, worker string, i, n int) func() {
	t.Helper()
	blocks := make([]uint64, n)
	for j := range blocks {
		blocks[j] = uint64(1_000_000*(i+1) + j)
	}
	booking := p.bookings.Book(worker, blocks, 0)
	return func() { booking.Release() }
}

// counter sums a counter family's series whose labels include every given label.
func (p *plane) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := p.registry.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// servedRequests returns what every worker was sent, in worker order.
func (p *plane) servedRequests() []fakeworker.Served {
	var out []fakeworker.Served
	for _, w := range p.workers {
		out = append(out, w.Served()...)
	}
	return out
}

// rawStream opens an ext_proc stream to the plane's server without the data plane, for
// tests that play Envoy's messages themselves, and returns a function that sends one
// message and reads the reply.
func (p *plane) rawStream(t *testing.T) func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	t.Helper()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	require.NoError(t, err)
	return func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		t.Helper()
		require.NoError(t, stream.Send(req))
		reply, err := stream.Recv()
		require.NoError(t, err)
		return reply
	}
}
