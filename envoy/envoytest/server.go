package envoytest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// Config is the part of Envoy's configuration the test data plane models: the ext_proc
// filter (ExternalProcessor), the connection buffer limit and the ORIGINAL_DST cluster.
type Config struct {
	// ProcessorAddress is the ext_proc server's host:port (the filter's grpc_service).
	ProcessorAddress string
	// ProcessingMode is the filter's processing_mode. Nil means Envoy's default: request
	// and response headers SEND, bodies NONE, trailers SKIP.
	ProcessingMode *extprocfilterv3.ProcessingMode
	// SendProtocolConfig sends protocol_config with the first message, as Envoy ≥ 1.34 does.
	SendProtocolConfig bool
	// FailureModeAllow is failure_mode_allow: on a processor failure, continue unmodified.
	FailureModeAllow bool
	// MessageTimeout is message_timeout (Envoy's default 200 ms); not applied in FULL_DUPLEX.
	MessageTimeout time.Duration
	// MaxMessageTimeout is max_message_timeout: a reply carrying override_message_timeout
	// restarts the running message timer at that value if it is in [1 ms,
	// MaxMessageTimeout] and the timer was not restarted for this message yet; Envoy
	// ignores it otherwise, and always with 0 (the default: the API is off). Such a
	// reply's other fields are ignored (ext_proc.cc, Filter::onNewTimeout;
	// ProcessorState::restartMessageTimer).
	MaxMessageTimeout time.Duration
	// SkipLocalReplies models the Envoy releases that keep the data plane's own local
	// replies (the router's 503 and 504, the 413 of a request past the buffer limit) from
	// the processor: 1.34 through 1.36 and the patch releases from 1.30.10, 1.31.6,
	// 1.32.4 and 1.33.1, where the runtime guard
	// envoy.reloadable_features.skip_ext_proc_on_local_reply (true by default) makes the
	// filter's onLocalReply mark processing complete (ext_proc.h; the CVE-2025-30157
	// fix). False, the default, is Envoy before that fix and from 1.37 (envoy PR #41769
	// re-enabled sending local replies; the guard and the override are gone): the
	// processor gets them as responses.
	SkipLocalReplies bool
	// StatusOnError is the status of the local reply when failing closed (default 500).
	StatusOnError int
	// AllowEnvoyMutations is mutation_rules.allow_envoy.
	AllowEnvoyMutations bool
	// ReceivingNamespaces is metadata_options.receiving_namespaces.untyped.
	ReceivingNamespaces []string
	// ForwardingNamespaces is metadata_options.forwarding_namespaces.untyped.
	ForwardingNamespaces []string
	// BufferLimit is per_connection_buffer_limit_bytes (Envoy's default 1 MiB).
	BufferLimit int
	// DestinationHeader is the ORIGINAL_DST cluster's original_dst_lb_config.http_header_name.
	DestinationHeader string
	// ServeFromFallbacks models a GIE data plane's endpoint selection instead of
	// ORIGINAL_DST (the override_host LB policy with fallbacks): the destination header
	// is a comma-separated list, tried in order, the next one when a connection to the
	// previous fails; and the endpoint that served is reported to the processor in the
	// response messages' metadata_context, envoy.lb / x-gateway-destination-endpoint-served
	// (GIE docs/proposals/004-endpoint-picker-protocol, "Destination Endpoint Served").
	ServeFromFallbacks bool
	// Routes are per-path settings, matched by longest path prefix.
	Routes []Route
	// ProcessorTLS, when set, is the TLS of the ext_proc gRPC connection (the cluster's
	// UpstreamTlsContext): the processor's CA and, for mTLS, a client certificate.
	ProcessorTLS *tls.Config
	// OnProcessorMessage, when set, is called with each message once it has been sent to
	// the processor, with the request's path. Tests use it to act at a known point of
	// the exchange (cancel the client after the headers went out, say). It must not
	// block for long: the request waits for it.
	OnProcessorMessage func(path string, msg *extprocv3.ProcessingRequest)

	// OnRoundTrip, when set, is called after each ext_proc message that waits for its
	// reply (every message outside FULL_DUPLEX_STREAMED), with the time from the send to
	// the reply's arrival in the data plane: the processor's latency as Envoy sees it,
	// gRPC and scheduling included. It is called concurrently from every request.
	OnRoundTrip func(RoundTrip)
	// DiscardExchanges records no Exchange, so Exchanges returns none: for load tests,
	// where keeping every message of every request would grow without bound.
	DiscardExchanges bool
}

// RoundTrip is one ext_proc message and the wait for its reply (Config.OnRoundTrip).
type RoundTrip struct {
	// Message is the kind sent: MessageRequestHeaders, MessageRequestBody,
	// MessageResponseHeaders or MessageResponseBody.
	Message string
	// Took is the time from the send to the reply's arrival.
	Took time.Duration
}

// The kinds of ext_proc message a RoundTrip names.
const (
	MessageRequestHeaders  = "request_headers"
	MessageRequestBody     = "request_body"
	MessageResponseHeaders = "response_headers"
	MessageResponseBody    = "response_body"
)

// messageKind names a message's kind for a RoundTrip.
func messageKind(msg *extprocv3.ProcessingRequest) string {
	switch msg.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return MessageRequestHeaders
	case *extprocv3.ProcessingRequest_RequestBody:
		return MessageRequestBody
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return MessageResponseHeaders
	case *extprocv3.ProcessingRequest_ResponseBody:
		return MessageResponseBody
	}
	return "other"
}

// Route holds what Envoy attaches to requests of one route.
type Route struct {
	// PathPrefix selects the route.
	PathPrefix string
	// GRPCInitialMetadata is ExtProcPerRoute.overrides.grpc_initial_metadata.
	GRPCInitialMetadata map[string]string
	// Timeout is the route's timeout (RouteAction.timeout): 0, the default here, is
	// none (Envoy's own default is 15 s). It runs from the request's end to the
	// response's: the router's 504 if response headers have not come, else a reset.
	Timeout time.Duration
	// DynamicMetadata is what earlier filters put in the request's dynamic metadata, by
	// namespace; only ForwardingNamespaces reach the processor.
	DynamicMetadata map[string]map[string]any
}

// Exchange records one HTTP request's conversation with the processor.
type Exchange struct {
	Path string
	// Sent and Received are the ext_proc messages, in order.
	Sent     []*extprocv3.ProcessingRequest
	Received []*extprocv3.ProcessingResponse
	// RouteCacheCleared reports whether a reply cleared the route cache (ENVOY.md §3).
	RouteCacheCleared bool
	// DynamicMetadata is the metadata Envoy kept from the replies (receiving namespaces).
	DynamicMetadata map[string]*structpb.Struct
	// IgnoredMutations lists header mutations Envoy ignored, with the reason.
	IgnoredMutations []string
	// MessageTimerRestarts are the override_message_timeout values that restarted a
	// message timer; IgnoredTimerOverrides counts those ignored (Config.MaxMessageTimeout).
	MessageTimerRestarts  []time.Duration
	IgnoredTimerOverrides int
	// Upstream is the ip:port the request was sent to, if any; Status what the client got.
	Upstream string
	Status   int
	// LocalReply reports that the data plane answered with a local reply of its own that
	// Envoy sends through the filter chain (the router's 503 or 504, the 413): the
	// processor saw it as a response unless it was out of the picture or
	// Config.SkipLocalReplies is set.
	LocalReply bool
}

// A Server is a test data plane. Create it with NewServer or NewUnstartedServer.
type Server struct {
	// URL is the base URL of the listener, "http://127.0.0.1:port".
	URL    string
	Config Config

	listener net.Listener
	http     *http.Server
	conn     *grpc.ClientConn
	upstream *http.Client
	client   *http.Client

	mu        sync.Mutex
	exchanges []*Exchange
	inflight  sync.WaitGroup
}

// NewServer starts a data plane for cfg and returns when it accepts connections.
func NewServer(cfg Config) *Server {
	s := NewUnstartedServer(cfg)
	s.Start()
	return s
}

// NewUnstartedServer returns a data plane whose Config may be changed before Start.
func NewUnstartedServer(cfg Config) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("envoytest: listen: %v", err))
	}
	return NewUnstartedServerOn(ln, cfg)
}

// NewUnstartedServerOn is NewUnstartedServer on a listener of the caller's (a fixed
// port, as cmd/dataplane takes); Close closes it.
func NewUnstartedServerOn(ln net.Listener, cfg Config) *Server {
	return &Server{Config: cfg, listener: ln, URL: "http://" + ln.Addr().String()}
}

// Start connects to the processor and starts serving.
func (s *Server) Start() {
	if s.http != nil {
		panic("envoytest: Server already started")
	}
	cfg := &s.Config
	if cfg.ProcessingMode == nil {
		cfg.ProcessingMode = &extprocfilterv3.ProcessingMode{}
	}
	if cfg.MessageTimeout == 0 {
		cfg.MessageTimeout = 200 * time.Millisecond
	}
	if cfg.StatusOnError == 0 {
		cfg.StatusOnError = http.StatusInternalServerError
	}
	if cfg.BufferLimit == 0 {
		cfg.BufferLimit = 1 << 20
	}
	if cfg.DestinationHeader == "" {
		cfg.DestinationHeader = "x-gateway-destination-endpoint"
	}
	cfg.DestinationHeader = strings.ToLower(cfg.DestinationHeader)
	creds := insecure.NewCredentials()
	if cfg.ProcessorTLS != nil {
		creds = credentials.NewTLS(cfg.ProcessorTLS)
	}
	conn, err := grpc.NewClient(cfg.ProcessorAddress, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		panic(fmt.Sprintf("envoytest: processor %q: %v", cfg.ProcessorAddress, err))
	}
	s.conn = conn
	s.client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	// Envoy keeps upstream connections pooled with no idle cap (the cluster's
	// max_connections circuit breaker, 1024 by default, bounds them); a small idle cap
	// would close and reopen connections under load and run through ephemeral ports.
	s.upstream = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 1024}}
	s.http = &http.Server{Handler: http.HandlerFunc(s.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.http.Serve(s.listener) }()
}

// Client returns an HTTP client for the server: the same one on every call, as
// httptest's, so its connections are reused and CloseIdleConnections reaches them.
func (s *Server) Client() *http.Client {
	if s.client == nil {
		s.client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	}
	return s.client
}

// CloseIdleConnections closes the idle keep-alive connections of Client and of the data
// plane's own upstream pool, so that a test can count goroutines without them.
func (s *Server) CloseIdleConnections() {
	s.Client().CloseIdleConnections()
	if s.upstream != nil {
		s.upstream.CloseIdleConnections()
	}
}

// Exchanges returns the conversations of finished requests, oldest first. It first waits
// for requests in flight to finish (a handler records its exchange after the client has
// seen the response), so call it when no request is outstanding.
func (s *Server) Exchanges() []*Exchange {
	s.inflight.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Exchange(nil), s.exchanges...)
}

// Close stops the listener, waits up to 5 s for requests in flight, then closes every
// connection; it returns an error naming how many were still stuck. (It does not use
// http.Server.Shutdown, which also waits for connections that were opened but never
// sent a request: a client's spare connection would hold Close for 5 s and fail it.)
func (s *Server) Close() error {
	if s.http == nil {
		return s.listener.Close()
	}
	s.http.SetKeepAlivesEnabled(false)
	_ = s.listener.Close()
	done := make(chan struct{})
	go func() { s.inflight.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		err = errors.New("envoytest: requests still in flight after 5s")
	}
	if cerr := s.http.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	s.CloseIdleConnections()
	return errors.Join(err, s.conn.Close())
}

func (s *Server) record(ex *Exchange) {
	if s.Config.DiscardExchanges {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exchanges = append(s.exchanges, ex)
}

func (s *Server) route(path string) Route {
	var best Route
	for _, r := range s.Config.Routes {
		if strings.HasPrefix(path, r.PathPrefix) && len(r.PathPrefix) >= len(best.PathPrefix) {
			best = r
		}
	}
	return best
}
