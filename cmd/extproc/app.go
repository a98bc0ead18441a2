package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/admin"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/enginemodels"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/policyapi"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// app is kvroute wired together: what build made, kept for serving and for tests.
type app struct {
	cfg      config.Config
	load     func() (config.Config, error)
	log      *slog.Logger
	registry *prometheus.Registry
	panics   *background.Metrics // the background loops' (probes, scrapes, model lists, KV events, peers, discovery, flow control)

	tokenizers    *models.Set
	index         *index.EventIndex
	events        *kvevents.Manager
	policy        *scoring.Policy
	picker        scoring.PickerSpec
	health        *health.Tracker
	scraper       *enginemetrics.Scraper
	signals       router.Signals    // nil unless the picker reads engine signals
	engineLoad    router.EngineLoad // nil unless the scraper reads load (a picker or priority.header needs it)
	objectives    *priority.Objectives
	rewrites      *rewrite.Table
	loraStates    router.LoRAStates // nil unless the picker reads engines' adapter states
	models        *enginemodels.Lister
	modelLists    router.ModelLists     // nil when engine_models is off
	contexts      router.ContextLengths // nil when engine_models is off
	sessions      *session.Store
	responses     *session.Store // which worker stored each Responses API response
	bookings      *scoring.Bookings
	router        *router.Router
	flow          *flowcontrol.Queue // flow control in front of the router (a pass-through when off)
	fleet         *fleet.Fleet
	runner        *discovery.Runner // feeds the fleet from the discovery source
	explain       *explain.Recorder
	filter        *filter.Server
	filterMetrics *filter.Metrics
	reloader      *config.Reloader
	process       *server.Process
	replica       string          // this process's id among the replicas (package peers)
	peerToken     string          // peers.token_file's secret; empty without one
	peers         *peers.Exchange // nil unless peers are configured
	peerMetrics   *peers.Metrics
	records       *peers.Records              // this replica's decisions' blocks for its watchers; nil without peers.share_blocks
	watchers      []fleet.Watcher             // told of every change of the worker set
	background    []func(ctx context.Context) // loops run while serving
	options       buildOptions
}

// build makes every part from the config, one concern per step, each step using what
// the earlier ones made; load re-reads the config for reloads (SIGHUP, POST /reload).
func build(cfg config.Config, load func() (config.Config, error), log *slog.Logger, options ...buildOption) (*app, error) {
	a := &app{cfg: cfg, load: load, log: log, registry: prometheus.NewRegistry()}
	for _, o := range options {
		o(&a.options)
	}
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.panics = background.NewMetrics(a.registry)
	for _, step := range []func() error{a.buildTokenizers, a.buildIndex, a.buildPolicy, a.buildObjectives, a.buildHealth, a.buildEngineMetrics, a.buildEngineModels,
		a.buildEvents, a.buildSessions, a.buildRecords, a.buildRouter, a.buildFilter, a.buildServer, a.buildDiscovery, a.buildPeers, a.buildAdmin} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// buildIndex makes one index for every worker: approximate entries for workers without
// KV events (and for event workers whose stream is silent), engine-reported ones for the
// rest.
func (a *app) buildIndex() (err error) {
	if a.index, err = index.NewEventIndex(a.cfg.Index, nil); err == nil {
		index.NewMetrics(a.registry, func() int { confirmed, recorded := a.index.Entries(); return confirmed + recorded })
	}
	return err
}

// buildTokenizers loads every model's tokenizer and chat template (or engine render
// client) once; the memo and engine series go on the registry.
func (a *app) buildTokenizers() (err error) {
	if a.tokenizers, err = loadTokenizers(a.cfg, a.log, engine.NewMetrics(a.registry), false); err == nil {
		models.NewMetrics(a.registry, a.tokenizers)
	}
	return err
}

// loadTokenizers loads the config's tokenizers section (extproc, validate and tokenize);
// textOnly skips the chat templates (tokenize -completions).
func loadTokenizers(cfg config.Config, log *slog.Logger, m *engine.Metrics, textOnly bool) (*models.Set, error) {
	return models.Load(cfg.Tokenizers, models.Deps{Logger: log, MaxPromptTokens: cfg.Filter.MaxPromptTokens, EngineMetrics: m, TextOnly: textOnly,
		DeferDefault: !mayServeModelsWithoutEntry(cfg)})
}

// mayServeModelsWithoutEntry reports whether cfg's workers may be asked for a model
// without a tokenizers entry: then the default tokenizer is loaded at start, so that
// no request waits for it. Otherwise (static workers that each list their models, every
// one with an entry) the embedded default loads only if a reload brings such a model.
func mayServeModelsWithoutEntry(cfg config.Config) bool {
	if cfg.Discovery.Source != discovery.SourceStatic {
		return true // the workers, and their models, are known once running
	}
	for _, w := range cfg.Router.Workers {
		if len(w.Models) == 0 {
			return true // it serves any model
		}
		for _, m := range w.Models {
			if _, ok := cfg.Tokenizers[m]; !ok {
				return true
			}
		}
	}
	return false
}

func (a *app) buildPolicy() (err error) {
	a.picker = scoring.Pickers()[a.cfg.Policy.Picker]
	if a.policy, err = scoring.NewPolicy(a.cfg.Policy.Params); err != nil {
		return fmt.Errorf("policy.%w", err)
	}
	return nil
}

// buildObjectives holds the config's objectives; with Kubernetes discovery the pool's
// InferenceObjectives join them (buildDiscovery), and a reload replaces the config's.
func (a *app) buildObjectives() error {
	a.objectives = priority.NewObjectives(a.cfg.Priority.Objectives)
	return nil
}

func (a *app) buildHealth() (err error) {
	a.health, err = health.New(a.cfg.Health, fleet.Targets(a.cfg.Router.Workers), health.Deps{
		Metrics: health.NewMetrics(a.registry), Panics: a.panics, Logger: a.log,
		// A worker that went down may come back restarted, with an empty cache: forget
		// what the index credits it with (DESIGN §7).
		OnDown: func(worker string) { _ = a.index.Clear(worker) },
	})
	a.watchers, a.background = append(a.watchers, a.health), append(a.background, a.health.Run)
	return err
}

// buildEngineMetrics scrapes every worker's metrics page: its KV capacity for any
// picker, its load signals for the pickers that read them and, while requests may name
// an objective (priority.header), for the saturation rule of sheddable ones.
func (a *app) buildEngineMetrics() (err error) {
	if a.scraper, err = enginemetrics.New(a.cfg.EngineMetrics, fleet.Targets(a.cfg.Router.Workers), nil, nil, a.log); err != nil {
		return err
	}
	a.scraper.CountPanics(a.panics)
	if a.picker.EngineLoRA {
		a.loraStates = a.scraper
	}
	if a.picker.EngineSignals { // a nil *Scraper must not become a non-nil interface
		a.signals = a.scraper
		if warning := a.cfg.EngineMetrics.StaleSignalsWarning(); warning != "" {
			a.log.Warn(warning, "picker", a.cfg.Policy.Picker)
		}
	}
	if a.picker.EngineSignals || a.cfg.Priority.Header != "" {
		// Read whatever the objectives are now: a reload or an InferenceObjective may
		// make one sheddable, and a load never read leaves no worker with capacity.
		a.engineLoad = a.scraper
	} else {
		a.scraper.CapacityOnly()
	}
	// The engines' running adapters count for the LoRA term as the router's own do.
	a.scraper.RememberAdapters(a.cfg.Router.LoRAResidency)
	a.watchers, a.background = append(a.watchers, a.scraper), append(a.background, a.scraper.Run)
	return nil
}

// buildEngineModels reads every worker's model list (/v1/models): which LoRA adapters
// its engine has loaded, so that an adapter's requests go only where it is, and each
// engine's context (max_model_len), so that a prompt goes only where it fits.
func (a *app) buildEngineModels() (err error) {
	if a.models, err = enginemodels.New(a.cfg.EngineModels, fleet.Targets(a.cfg.Router.Workers),
		enginemodels.Deps{Log: a.log, Registerer: a.registry, Panics: a.panics}); err != nil {
		return err
	}
	if a.models.Enabled() { // a nil-free interface only when lists are read
		a.modelLists, a.contexts = a.models, a.models
		a.watchers, a.background = append(a.watchers, a.models), append(a.background, a.models.Run)
	}
	return nil
}

// buildEvents subscribes to the KV events of the workers that publish them.
func (a *app) buildEvents() (err error) {
	a.events, err = kvevents.New(a.cfg.KVEvents, kvevents.Deps{
		Index: a.index, BlockSize: a.cfg.Router.BlockSize, DefaultCapacity: a.cfg.Index.CapacityBlocks,
		OffloadCapacity: a.cfg.Index.OffloadCapacityBlocks,
		Registerer:      a.registry, Panics: a.panics, Logger: a.log,
		ApproxTokenizer: a.tokenizers.Approx,
	})
	if err == nil {
		a.background = append(a.background, a.events.Run)
	}
	return err
}

// buildSessions makes the session store (with session.header empty the filter reads no
// session ids, and it stays empty) and the memory of which worker stored each
// Responses API response and opened each SGLang session (empty without
// filter.responses_paths and filter.sglang_open_session_paths).
func (a *app) buildSessions() (err error) {
	if a.sessions, err = session.New(a.cfg.Session, nil); err != nil {
		return err
	}
	session.NewMetrics(a.registry, a.sessions)
	if a.responses, err = session.NewResponses(a.cfg.Responses, nil); err != nil {
		return err
	}
	session.NewResponsesMetrics(a.registry, a.responses)
	return nil
}

// buildRecords keeps this replica's decisions' blocks for the replicas watching it
// (peers.share_blocks), whether or not it watches any itself.
func (a *app) buildRecords() error {
	a.peerMetrics = peers.NewMetrics(a.registry) // 0 peers live is worth showing too
	if a.cfg.Peers.ShareBlocks {
		a.records = peers.NewRecords(a.peerMetrics)
	}
	return nil
}

// recordSink is a.records as the router's sink: nil, not a nil *peers.Records.
func (a *app) recordSink() router.RecordSink {
	if a.records == nil {
		return nil
	}
	return a.records
}

// responseSink is a.records as the router's sink of stored responses, alike.
func (a *app) responseSink() router.ResponseSink {
	if a.records == nil {
		return nil
	}
	return a.records
}

func (a *app) buildRouter() (err error) {
	a.bookings = scoring.NewBookingsResident(a.cfg.Router.LoRAResidency, nil)
	if a.router, err = router.New(a.cfg.Router, router.Deps{Tokenizers: a.tokenizers, Metrics: router.NewMetrics(a.registry),
		Index: a.index, Bookings: a.bookings, Picker: a.picker.New(a.policy, a.cfg.Policy.Rand()), RecordBlocks: true, Records: a.recordSink(),
		PrefillPicker: a.picker.New(a.policy, a.cfg.Policy.RandStream(1)), Health: a.health, Signals: a.signals, LoRASlots: a.scraper, EngineAdapters: a.scraper, LoRAStates: a.loraStates, ModelLists: a.modelLists, ContextLengths: a.contexts, Sessions: a.sessions, Responses: a.responses, ResponseRecords: a.responseSink(), Policy: a.policy,
		Objectives: a.objectives, Saturation: a.cfg.Priority.Saturation(), EngineLoad: a.engineLoad}); err != nil {
		return err
	}
	// Per-worker filter counters follow the fleet, so a removed worker's series go too.
	a.filterMetrics = filter.NewMetrics(a.registry)
	if a.fleet, err = fleet.New(a.cfg.Router.Workers, fleet.Deps{Index: a.index, Router: a.router, Bookings: a.bookings,
		Watchers: append(a.watchers, a.filterMetrics), Events: a.events, DefaultCapacityBlocks: a.cfg.Index.CapacityBlocks}); err != nil {
		return err
	}
	a.scraper.ReportCapacity(a.cfg.Router.BlockSize, a.fleet.SetScrapedCapacity)
	if a.cfg.EngineMetrics.UnseenRequests {
		a.scraper.ReportRequests(a.bookings.SetEngineRequests)
	}
	fleet.NewMetrics(a.registry, a.fleet)
	scoring.NewMetrics(a.registry, a.bookings, a.fleet.Names)
	return nil
}

func (a *app) buildFilter() (err error) {
	if a.explain, err = explain.New(a.cfg.Explain, nil); err != nil {
		return err
	}
	a.buildRewrites()
	if a.flow, err = flowcontrol.New(a.cfg.FlowControl, flowcontrol.Deps{Router: a.router, Ledger: a.bookings, Metrics: flowcontrol.NewMetrics(a.registry),
		Panics: a.panics, Log: a.log}); err != nil {
		return err
	}
	a.warnFlowControl()
	var heldMessageTimeout time.Duration
	if a.cfg.FlowControl.Enabled {
		heldMessageTimeout = a.cfg.FlowControl.OverrideMessageTimeout
	}
	a.filter, err = filter.New(a.cfg.Filter, filter.Deps{Router: a.flow, Policy: a.policy, Metrics: a.filterMetrics,
		Logger: a.log, Health: a.health, Explain: a.explain, SessionHeaders: a.cfg.Session.Headers(), ObjectiveHeaders: a.cfg.Priority.Headers(),
		FairnessHeaders: a.cfg.FlowControl.Headers(), HeldMessageTimeout: heldMessageTimeout, Rewrites: a.rewrites})
	return err
}

// overrideMargin is how much longer than max_wait flow_control.override_message_timeout
// should be, for the answer kvroute gives as a wait ends to reach Envoy before its timer.
const overrideMargin = time.Second

// warnFlowControl logs the configs in which flow control cannot do what it is on for:
// one that refuses no request for capacity, and Envoy's message timer cutting held
// requests short.
func (a *app) warnFlowControl() {
	fc := a.cfg.FlowControl
	if !fc.Enabled {
		return
	}
	if a.cfg.Router.MaxActiveRequestsPerWorker == 0 && a.cfg.Priority.Header == "" && !fc.HoldOnSaturation {
		a.log.Warn("flow_control holds nothing: without max_active_requests_per_worker, priority.header or flow_control.hold_on_saturation no request is refused for capacity")
	}
	switch {
	case a.cfg.Filter.RequestBodyMode == filter.ModeFullDuplex:
		// No message timer: nothing to say.
	case fc.OverrideMessageTimeout == 0:
		a.log.Warn("flow_control: unless Envoy's ext_proc filter runs request_body_mode FULL_DUPLEX_STREAMED (no message timer), its message_timeout must be longer than flow_control.max_wait, or Envoy answers a held request 504; or set flow_control.override_message_timeout and Envoy's max_message_timeout",
			"max_wait", fc.MaxWait, "request_body_mode", a.cfg.Filter.RequestBodyMode)
	case fc.OverrideMessageTimeout < fc.MaxWait+overrideMargin:
		// A request held to max_wait is answered (its 429, or a decision made as the wait
		// ended) a little after it: an override no longer races Envoy's timer.
		a.log.Warn("flow_control.override_message_timeout is under max_wait plus a second: Envoy may answer a request held that long 504 before kvroute does",
			"override_message_timeout", fc.OverrideMessageTimeout, "max_wait", fc.MaxWait)
	default:
		a.log.Info("flow_control: a held request asks Envoy to restart its message timer at override_message_timeout; Envoy's ext_proc filter needs max_message_timeout at least as long, or it ignores that",
			"override_message_timeout", fc.OverrideMessageTimeout)
	}
}

// buildRewrites holds the config's model rewrites; with Kubernetes discovery the pool's
// InferenceModelRewrites join them (buildDiscovery), and a reload replaces the config's.
// Targets are drawn from a stream of their own, seeded from policy.seed.
func (a *app) buildRewrites() {
	seeds := a.cfg.Policy.Rand()
	a.rewrites = rewrite.NewTable(a.cfg.ModelRewrites, rand.New(rand.NewPCG(seeds.Uint64(), seeds.Uint64())), rewrite.NewMetrics(a.registry))
}

func (a *app) buildServer() error {
	metrics := server.NewMetrics(a.registry)
	var opts []grpc.ServerOption
	if a.cfg.TLS.Enabled() {
		certs, err := server.NewCertReloader(a.cfg.TLS, a.log)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(certs.TLSConfig())))
	}
	a.process = server.New(a.filter, a.cfg.Filter.MaxBodyBytes, a.log, metrics, opts...)
	a.process.Background, a.process.Grace = a.background, a.cfg.ShutdownGrace
	a.process.OnDrain = append(a.process.OnDrain, a.flow.Close)
	if a.cfg.HealthAddress != "" {
		// kubelet's gRPC probes speak no TLS: the same health statuses, in plaintext.
		a.process.PlainHealth = grpc.NewServer(append(server.Recovery(a.log, metrics), grpc.ConnectionTimeout(server.HandshakeTimeout))...)
		healthpb.RegisterHealthServer(a.process.PlainHealth, a.process.Health)
	}
	return nil
}

// buildDiscovery feeds the fleet from discovery.source; readiness waits for its first
// worker list.
func (a *app) buildDiscovery() error {
	// Without an objective header no request names an objective: their priorities
	// would go unread.
	var objectives kube.ObjectiveSink
	if a.cfg.Priority.Header != "" {
		objectives = a.objectives
	}
	options := a.options
	options.rewrites = a.rewrites // the pool's InferenceModelRewrites join the config's
	source, err := newSource(a.cfg, a.log, a.panics, options, objectives)
	if err != nil {
		return err
	}
	a.runner, err = discovery.NewRunner(a.cfg.Discovery.Source, source, discovery.RunnerDeps{
		Fleet: a.fleet, OnChange: a.process.Refresh, Metrics: discovery.NewMetrics(a.registry), Logger: a.log,
	})
	if err == nil {
		a.process.Readiness, a.process.Background = a.runner.Ready, append(a.process.Background, a.runner.Run)
	}
	return err
}

// buildPeers watches the other replicas' booked load into the ledger, when peers are
// configured; every replica serves its own (buildAdmin) whether or not it watches.
func (a *app) buildPeers() (err error) {
	a.replica = peers.NewReplicaID()
	// Read whether or not this replica watches: its own report is guarded too.
	if a.peerToken, err = a.cfg.Peers.Token(); err != nil {
		return err
	}
	if !a.cfg.Peers.Enabled() {
		return nil
	}
	if warning := a.cfg.Peers.UnreachableWarning(a.cfg.AdminAddress, admin.IsLoopback); warning != "" {
		a.log.Warn(warning, "admin_address", a.cfg.AdminAddress)
	}
	deps := peers.Deps{Ledger: a.bookings, Replica: a.replica, Token: a.peerToken, Metrics: a.peerMetrics, Panics: a.panics, Logger: a.log}
	if a.cfg.Peers.ShareBlocks {
		deps.Blocks, deps.BlockSize = a.router, a.cfg.Router.BlockSize
		if a.cfg.Session.Header != "" { // else this replica reads no sessions: it need not remember the peers'
			deps.Sessions = a.sessions
		}
		// Else no request here names a stored response or an SGLang session.
		if len(a.cfg.Filter.ResponsesPaths) > 0 || len(a.cfg.Filter.SGLangOpenSessionPaths) > 0 {
			deps.Responses = a.responses
		}
	}
	a.peers, err = peers.New(a.cfg.Peers, deps)
	if err == nil {
		a.process.Background = append(a.process.Background, a.peers.Run)
	}
	return err
}

func (a *app) buildAdmin() error {
	for _, warning := range admin.ExposureWarnings(a.cfg.AdminAddress, admin.Config{RemoteChanges: a.cfg.AdminRemoteChanges, Pprof: a.cfg.AdminPprof,
		ClientCertificates: a.cfg.AdminTLS.ClientCAFile != ""}) {
		a.log.Warn(warning, "admin_address", a.cfg.AdminAddress)
	}
	a.reloader = config.NewReloader(a.cfg, a.load, config.Targets{Fleet: a.runner, Policy: a.policy, Objectives: a.objectives,
		Rewrites: a.rewrites, Secrets: a.tokenizers}, a.log, config.NewMetrics(a.registry))
	readOnly := ""
	if !a.picker.HasCost {
		readOnly = fmt.Sprintf("policy.picker is %s, which has no cost parameters to change", a.cfg.Policy.Picker)
	}
	policyHandler, err := policyapi.Handler(policyapi.Config{Policy: a.policy, ReadOnly: readOnly, Logger: a.log, Metrics: policyapi.NewMetrics(a.registry)})
	if err != nil {
		return err
	}
	watchesEnd := make(chan struct{})
	view := fleet.ViewDeps{Health: a.health, Index: a.index, Load: a.bookings, LoRA: a.scraper}
	if a.models.Enabled() {
		view.ModelLists = a.models
	}
	handler, err := admin.Handler(admin.Config{RemoteChanges: a.cfg.AdminRemoteChanges, Pprof: a.cfg.AdminPprof}, admin.Deps{
		Gatherer: a.registry, Ready: a.process.Ready, Policy: policyHandler, Decisions: a.explain,
		PeerLoad: peers.Handler(a.replica, a.bookings, peers.HandlerOptions{Interval: a.cfg.Peers.Interval, Heartbeat: peers.Heartbeat,
			Done: watchesEnd, MaxWatchers: peers.MaxAddresses, Token: a.peerToken, Records: a.records, BlockSize: a.cfg.Router.BlockSize}),
		Reload:  func() (any, error) { return a.reloader.Reload() },
		Workers: a.fleet.ViewHandler(view),
		Peers:   peers.StatusHandler(a.replica, a.cfg.Peers, a.peers),
	})
	// IdleTimeout closes keep-alive connections left idle between requests (scrapers,
	// dashboards, peers that went away); the peers' watch streams are one long request
	// each, which it does not cut.
	a.process.Admin = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: server.HTTPErrorLog(a.log, "admin port")}
	if a.cfg.AdminTLS.Enabled() {
		certs, err := server.NewHTTPCertReloader(a.cfg.AdminTLS, "admin_tls", a.log)
		if err != nil {
			return err
		}
		a.process.Admin.TLSConfig = certs.TLSConfig()
	}
	// The peers' watch streams never go idle: end them when the admin server shuts
	// down, or Shutdown would wait for them until its deadline.
	a.process.Admin.RegisterOnShutdown(sync.OnceFunc(func() { close(watchesEnd) }))
	return err
}
