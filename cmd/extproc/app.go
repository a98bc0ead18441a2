package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/policyapi"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenize"
)

// pickers maps policy.picker to its constructor: the one place policies are named.
var pickers = map[string]func(p *scoring.Policy, rng *rand.Rand) scoring.Picker{
	"kv":          func(p *scoring.Policy, rng *rand.Rand) scoring.Picker { return scoring.NewKVCostWithPolicy(p, rng) },
	"round_robin": func(*scoring.Policy, *rand.Rand) scoring.Picker { return &scoring.RoundRobin{} },
	"random":      func(_ *scoring.Policy, rng *rand.Rand) scoring.Picker { return scoring.NewRandom(rng) },
	"least_load":  func(*scoring.Policy, *rand.Rand) scoring.Picker { return scoring.LeastLoad{} },
	"gie":         func(_ *scoring.Policy, rng *rand.Rand) scoring.Picker { return scoring.NewGIE(rng) },
}

// pickersWithSignals read what the engines report of themselves: for them, and only
// them, kvroute scrapes the engines' metrics.
var pickersWithSignals = map[string]bool{"gie": true}

// healthServices are the gRPC health services answered on the ext_proc port: Envoy's
// cluster health check uses the ext_proc service name; GIE adds liveness and readiness.
var healthServices = []string{"", "envoy.service.ext_proc.v3.ExternalProcessor", "liveness", "readiness"}

// app is kvroute wired together.
type app struct {
	// shutdownGrace and picker are fixed for the process's life (a reload cannot change
	// them), so serve reads them without the reload lock.
	shutdownGrace time.Duration
	picker        string

	cfg      config // the config in force; guarded by reloadMu
	log      *slog.Logger
	registry *prometheus.Registry
	bookings *scoring.Bookings
	router   *router.Router
	index    *index.Index
	policy   *scoring.Policy
	// load reads the config again for a reload (SIGHUP or POST /reload); nil: reload
	// is refused.
	load     func() (config, error)
	reloadMu sync.Mutex // one reload at a time; guards cfg
	reloads  *prometheus.CounterVec
	grpc     *grpc.Server
	tracker  *health.Tracker
	scraper  *enginemetrics.Scraper // nil unless the picker reads engine signals
	health   *grpchealth.Server
	admin    *http.Server
	ready    atomic.Bool
}

func newApp(cfg config, log *slog.Logger) (*app, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	idx, err := index.New(cfg.Index, nil)
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Router.Workers {
		if err := idx.SetWorker(w.Name, w.CapacityBlocks); err != nil {
			return nil, err
		}
	}
	seed := cfg.Policy.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	policy, err := scoring.NewPolicy(cfg.Policy.Params)
	if err != nil {
		return nil, fmt.Errorf("policy.%w", err)
	}
	picker := pickers[cfg.Policy.Picker](policy, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
	targets := pollTargets(cfg.Router.Workers)
	tracker, err := health.New(cfg.Health, targets, health.Deps{
		Registerer: reg, Logger: log,
		// A worker that went down may come back restarted, with an empty cache: forget
		// what the index credits it with (DESIGN §7).
		OnDown: func(worker string) { _ = idx.Clear(worker) },
	})
	if err != nil {
		return nil, err
	}
	var scraper *enginemetrics.Scraper
	var signals router.Signals // a nil *Scraper must not become a non-nil interface
	if pickersWithSignals[cfg.Policy.Picker] {
		if scraper, err = enginemetrics.New(cfg.EngineMetrics, targets, nil, nil, log); err != nil {
			return nil, err
		}
		signals = scraper
	}
	bookings := scoring.NewBookings()
	r, err := router.New(cfg.Router, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx,
		Bookings: bookings, Picker: picker, RecordBlocks: true, Health: tracker, Signals: signals,
	})
	if err != nil {
		return nil, err
	}
	if err := scoring.NewMetrics(reg, bookings, func() []string {
		workers := r.Workers()
		names := make([]string, len(workers))
		for i, w := range workers {
			names[i] = w.Name
		}
		return names
	}); err != nil {
		return nil, err
	}
	if err := index.NewMetrics(reg, idx); err != nil {
		return nil, err
	}
	ext, err := filter.New(cfg.Filter, filter.Deps{Router: r, Policy: policy, Metrics: filter.NewMetrics(reg), Logger: log, Health: tracker})
	if err != nil {
		return nil, err
	}

	a := &app{shutdownGrace: cfg.ShutdownGrace, picker: cfg.Policy.Picker, cfg: cfg, log: log, registry: reg, bookings: bookings, router: r, index: idx, policy: policy,
		tracker: tracker, scraper: scraper, health: grpchealth.NewServer(),
		reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "config", Name: "reloads_total",
			Help: "Config reloads (SIGHUP or POST /reload on the admin port), by result (applied, rejected).",
		}, []string{"result"}),
	}
	a.grpc = grpc.NewServer(append(server.Options(cfg.Filter.MaxBodyBytes), server.Recovery(log, server.NewMetrics(reg))...)...)
	extprocv3.RegisterExternalProcessorServer(a.grpc, ext)
	healthpb.RegisterHealthServer(a.grpc, a.health)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	readOnly := ""
	if cfg.Policy.Picker != "kv" {
		readOnly = fmt.Sprintf("policy.picker is %s, which has no cost parameters to change", cfg.Policy.Picker)
	}
	policyHandler, err := policyapi.Handler(policyapi.Config{Policy: policy, ReadOnly: readOnly, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	mux.Handle("/policy", changesFromLoopback(cfg.AdminRemoteChanges, policyHandler))
	mux.Handle("POST /reload", changesFromLoopback(cfg.AdminRemoteChanges, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		summary, err := a.reload()
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(summary)
	})))
	a.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return a, nil
}

// changesFromLoopback refuses (403) requests that would change routing (anything but
// GET and HEAD) from clients outside loopback, unless remote changes are allowed: the
// admin port is often reachable for scraping, and scraping must not grant control.
func changesFromLoopback(allowRemote bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowRemote && r.Method != http.MethodGet && r.Method != http.MethodHead {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			if ip, err := netip.ParseAddr(host); err != nil || !ip.Unmap().IsLoopback() {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": "changes are accepted from loopback only (admin_remote_changes: false)"})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// pollTargets is what the health probes and the metrics scrapes need of the fleet.
func pollTargets(workers []router.Worker) []poll.Target {
	out := make([]poll.Target, len(workers))
	for i, w := range workers {
		out[i] = poll.Target{Name: w.Name, Address: w.Address}
	}
	return out
}

// serve runs the gRPC and admin servers until ctx is done, then drains: health turns
// NOT_SERVING, in-flight streams get shutdown_grace to finish, the rest are cut.
func (a *app) serve(ctx context.Context, grpcLn, adminLn net.Listener) error {
	errs := make(chan error, 2)
	go func() { errs <- a.grpc.Serve(grpcLn) }()
	go func() {
		if err := a.admin.Serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	}()
	probeCtx, stopProbes := context.WithCancel(context.Background())
	var background sync.WaitGroup
	background.Go(func() { a.tracker.Run(probeCtx) })
	if a.scraper != nil {
		background.Go(func() { a.scraper.Run(probeCtx) })
	}
	defer func() { stopProbes(); background.Wait() }()
	a.setServing(true)
	a.log.Info("kvroute serving", "grpc", grpcLn.Addr().String(), "admin", adminLn.Addr().String(),
		"workers", len(a.router.Workers()), "picker", a.picker)

	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	a.setServing(false)
	a.log.Info("kvroute draining", "grace", a.shutdownGrace.String())
	drained := make(chan struct{})
	go func() { a.grpc.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(a.shutdownGrace):
		a.log.Warn("shutdown grace expired: cutting streams still in flight")
		a.grpc.Stop()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(err, a.admin.Shutdown(shutdownCtx))
}

func (a *app) setServing(on bool) {
	a.ready.Store(on)
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if on {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range healthServices {
		if svc == "liveness" {
			a.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
			continue
		}
		a.health.SetServingStatus(svc, status)
	}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log_level: must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}
