package filter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// Router is what the filter needs of the decision engine: *router.Router satisfies it.
// On success the filter owns the decision's booking and releases it exactly once.
type Router interface {
	Route(ctx context.Context, req *router.Request) (*router.Decision, error)
}

// Server is the ext_proc gRPC service. Build it with [New] and register it with
// extprocv3.RegisterExternalProcessorServer.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     Config
	router  Router
	policy  *scoring.Policy // the parameters in force: the base of per-route overrides
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time
	health  StatusObserver // nil: no one to tell
	paths   map[string]openai.Endpoint
	// opensSessions are sglang_open_session_paths: the answer names the session opened.
	opensSessions map[string]bool
	// storedPrefixes are responses_paths with a trailing slash: <path>/<id>[/...] names
	// a stored response.
	storedPrefixes []string
	// messagesPaths are messages_paths: the paths, and those under them, whose errors
	// are answered in Anthropic's shape.
	messagesPaths []string
	explain       *explain.Recorder
	// sessionHeaders name the request headers that carry the session id, in the order
	// they count; none: requests have no session.
	sessionHeaders []string
	// objectiveHeaders name the request headers that carry the GIE objective, the first
	// present read; none: requests name none.
	objectiveHeaders []string
	// fairnessHeaders name the request headers that carry the flow-control fairness id,
	// the first present read; none: requests name none.
	fairnessHeaders []string
	// heldMessageTimeout is the override_message_timeout sent as flow control holds a
	// request (Deps.HeldMessageTimeout); 0: none.
	heldMessageTimeout time.Duration
	// rewrites chooses a request's target model; nil: none.
	rewrites ModelRewriter
	// bodies bounds the bytes of the bodies decoded at once (max_concurrent_body_bytes).
	bodies bodyBudget
	// removeUnsplit and removeSplit are the prefill headers a routed request loses when
	// it is not split, and when it is (the sidecar's legacy one): built once and shared
	// read-only by every reply (their capacity is their length, so a reply that removes
	// one more header appends to a copy), which saves an allocation per request.
	removeUnsplit, removeSplit []string
}

// Deps are a Server's collaborators. Router is required; the rest have defaults.
type Deps struct {
	Router Router
	// Policy holds the parameters in force (the config's, or a runtime update's):
	// per-route overrides change only the keys they name. Nil means the built-in default.
	Policy  *scoring.Policy
	Metrics *Metrics
	// Logger receives errors, and at debug level one line per decision with every
	// candidate's cost terms (the decision trace).
	Logger *slog.Logger
	Now    func() time.Time
	// Health, when set, is told the status each routed request's worker answered with,
	// so 5xx answers count against the worker (DESIGN §7).
	Health StatusObserver
	// Explain answers requests that ask for their decision and samples decisions for
	// the admin port. Nil means explain's default header with answers and sampling off;
	// either way the explain request header is never forwarded upstream.
	Explain *explain.Recorder
	// SessionHeaders are the request headers whose value names the request's session
	// (session.Config.Headers: session.header, then the agents' headers): the first a
	// request carries with a value counts; none: requests have no session.
	SessionHeaders []string
	// ObjectiveHeaders are the request headers whose value names the request's Gateway
	// API Inference Extension objective (priority.header: priority.Config.Headers), whose
	// priority the router looks up: the first one a request carries counts (its last
	// value), as llm-d-router reads a header and its deprecated alias; none: requests
	// name none. The headers are forwarded as they came, as the pickers leave them.
	ObjectiveHeaders []string
	// FairnessHeaders are the request headers whose value names the request's fairness
	// id for flow control (flowcontrol.Config.Headers: llm-d-router's
	// x-llm-d-inference-fairness-id and GIE's alias): the first one a request carries
	// counts (its last value); none: requests name none. Forwarded as they came.
	FairnessHeaders []string
	// HeldMessageTimeout, when not 0, is the override_message_timeout the filter sends
	// Envoy as flow control holds a request (flow_control.override_message_timeout;
	// router.Request.OnHeld), outside FULL_DUPLEX_STREAMED, where Envoy runs no
	// message timer.
	HeldMessageTimeout time.Duration
	// Rewrites, when set, chooses each routed request's target model (GIE's
	// InferenceModelRewrite): the request is routed on the target, and the body
	// forwarded carries it. *rewrite.Table satisfies it. With or without it, the
	// model-name rewrite header (rewrite.HeaderNames) sets the target of a request no
	// rewrite matches.
	Rewrites ModelRewriter
}

// ModelRewriter chooses the target model of a request for model, or reports that no
// rewrite matches (the request is left as it is).
type ModelRewriter interface {
	Choose(model string) (rewrite.Choice, bool)
}

// StatusObserver is told the HTTP status a worker answered a routed request with, and
// the address the request was sent to. *health.Tracker satisfies it.
type StatusObserver interface {
	Observe(worker, address string, status int)
}

// New returns a Server.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Router == nil {
		return nil, errors.New("filter: a Router is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Policy == nil {
		policy, err := scoring.NewPolicy(scoring.DefaultParams())
		if err != nil {
			return nil, err
		}
		deps.Policy = policy
	}
	if deps.Explain == nil {
		off := explain.Config{Header: explain.DefaultConfig().Header, Buffer: 1}
		recorder, err := explain.New(off, nil)
		if err != nil {
			return nil, err
		}
		deps.Explain = recorder
	}
	// Header keys go to Envoy lower case; lower the names once, not per request.
	cfg.DestinationHeader = strings.ToLower(cfg.DestinationHeader)
	cfg.ModelHeader = strings.ToLower(cfg.ModelHeader)
	cfg.PrefillHeader = strings.ToLower(cfg.PrefillHeader)
	paths := make(map[string]openai.Endpoint)
	for _, p := range cfg.ChatPaths {
		paths[p] = openai.ChatCompletions
	}
	for _, p := range cfg.CompletionsPaths {
		paths[p] = openai.Completions
	}
	var storedPrefixes []string
	for _, p := range cfg.ResponsesPaths {
		paths[p] = openai.Responses
		storedPrefixes = append(storedPrefixes, p+"/")
	}
	for _, p := range cfg.MessagesPaths {
		paths[p] = openai.Messages
	}
	for _, p := range cfg.GeneratePaths {
		paths[p] = openai.Generate
	}
	for _, p := range cfg.SGLangGeneratePaths {
		paths[p] = openai.SGLangGenerate
	}
	for _, p := range cfg.SGLangCloseSessionPaths {
		paths[p] = openai.SGLangCloseSession
	}
	opensSessions := make(map[string]bool, len(cfg.SGLangOpenSessionPaths))
	for _, p := range cfg.SGLangOpenSessionPaths {
		paths[p] = openai.SGLangOpenSession
		opensSessions[p] = true
	}
	removeUnsplit, removeSplit := []string{cfg.PrefillHeader, legacyPrefillHeader}, []string{legacyPrefillHeader}
	if cfg.PrefillHeader == legacyPrefillHeader {
		removeUnsplit, removeSplit = []string{legacyPrefillHeader}, nil
	}
	return &Server{cfg: cfg, router: deps.Router, policy: deps.Policy, metrics: deps.Metrics, log: deps.Logger, now: deps.Now,
		health: deps.Health, paths: paths, opensSessions: opensSessions, storedPrefixes: storedPrefixes, messagesPaths: slices.Clone(cfg.MessagesPaths), explain: deps.Explain, sessionHeaders: lower(deps.SessionHeaders), objectiveHeaders: lower(deps.ObjectiveHeaders), fairnessHeaders: lower(deps.FairnessHeaders), heldMessageTimeout: deps.HeldMessageTimeout, rewrites: deps.Rewrites,
		removeUnsplit: slices.Clip(removeUnsplit), removeSplit: slices.Clip(removeSplit), bodies: bodyBudget{max: cfg.MaxConcurrentBodyBytes}}, nil
}

// lower returns the header names in lower case, as Envoy sends them, dropping empty ones.
func lower(names []string) []string {
	var out []string
	for _, n := range names {
		if n != "" {
			out = append(out, strings.ToLower(n))
		}
	}
	return out
}

// Process handles one ext_proc stream: one HTTP request and its response. Whatever ends
// the stream (the response's end, a client cancel, an upstream error, a gRPC error or
// Envoy dropping the stream), the request's booking is released exactly once, by the
// deferred call below.
func (s *Server) Process(grpcStream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := grpcStream.Context()
	st := s.newStream(ctx)
	st.send = grpcStream.Send
	defer st.release(outcomeCancelled)

	for {
		req, err := grpcStream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(ctx.Err(), context.Canceled) {
				return nil // Envoy closes the stream after the last reply it expects
			}
			s.metrics.streamError("recv")
			return err
		}
		replies, err := st.handle(ctx, req)
		if err != nil {
			s.metrics.streamError("protocol")
			return err
		}
		for _, reply := range replies {
			if err := grpcStream.Send(reply); err != nil {
				s.metrics.streamError("send")
				return err
			}
		}
		if st.phase == phaseDone {
			return nil
		}
	}
}

// newStream reads what applies to the whole stream from its gRPC metadata, set by the
// route's grpc_initial_metadata: a per-route policy override, and whether the route
// answers explain requests.
func (s *Server) newStream(ctx context.Context) *stream {
	st := &stream{srv: s, reqMode: s.cfg.RequestBodyMode, respMode: s.cfg.ResponseBodyMode}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get(PolicyMetadataKey); len(vals) > 0 {
			st.override, st.overrideErr = newRouteOverride(s.policy.Params(), []byte(vals[0]))
		}
		if vals := md.Get(ExplainMetadataKey); len(vals) > 0 && st.overrideErr == nil {
			answer, err := strconv.ParseBool(vals[0])
			if err != nil {
				st.overrideErr = fmt.Errorf("%w: %s: must be true or false, got %q", ErrBadOverride, ExplainMetadataKey, vals[0])
			}
			st.explainOff = err == nil && !answer
		}
	}
	return st
}

// storedResponseID returns the id of the stored Responses API response path names
// (<responses path>/<id>, and anything under it: cancel, input_items), or "" when it
// names none. An id no engine could have made (longer than openai.MaxResponseIDBytes)
// names none: the request goes by load, and the engine answers it.
func (s *Server) storedResponseID(path string) string {
	for _, prefix := range s.storedPrefixes {
		rest, ok := strings.CutPrefix(path, prefix)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, "/")
		if id == "" || len(id) > openai.MaxResponseIDBytes {
			return ""
		}
		return id
	}
	return ""
}

// underMessagesPath reports whether path is a messages_paths entry or its subpath
// (<path>/count_tokens): a request whose client reads Anthropic's errors, whatever its
// method (one not a POST is routed by load).
func (s *Server) underMessagesPath(path string) bool {
	for _, p := range s.messagesPaths {
		if rest, ok := strings.CutPrefix(path, p); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
			return true
		}
	}
	return false
}
