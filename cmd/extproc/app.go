package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/admin"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/policyapi"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenize"
)

// app is kvroute wired together: what build made, kept for serving and for tests.
type app struct {
	registry *prometheus.Registry
	bookings *scoring.Bookings
	index    *index.Index
	router   *router.Router
	policy   *scoring.Policy
	reloader *config.Reloader
	process  *server.Process
	fleet    *fleet.Fleet
	runner   *discovery.Runner
}

// build makes every part from the config and wires them; load re-reads the config for
// reloads (SIGHUP, POST /reload).
func build(cfg config.Config, load func() (config.Config, error), log *slog.Logger, options ...buildOption) (*app, error) {
	var opts buildOptions
	for _, o := range options {
		o(&opts)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	workers := cfg.Router.Workers

	idx, err := index.New(cfg.Index, nil)
	if err != nil {
		return nil, err
	}
	policy, err := scoring.NewPolicy(cfg.Policy.Params)
	if err != nil {
		return nil, fmt.Errorf("policy.%w", err)
	}
	seed := cfg.Policy.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	spec := scoring.Pickers()[cfg.Policy.Picker]
	picker := spec.New(policy, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
	tracker, err := health.New(cfg.Health, fleet.Targets(workers), health.Deps{
		Metrics: health.NewMetrics(reg), Logger: log,
		// A worker that went down may come back restarted, with an empty cache: forget
		// what the index credits it with (DESIGN §7).
		OnDown: func(worker string) { _ = idx.Clear(worker) },
	})
	if err != nil {
		return nil, err
	}
	// Every worker's metrics page is scraped: its KV capacity for any picker, its load
	// signals for the pickers that read them.
	scraper, err := enginemetrics.New(cfg.EngineMetrics, fleet.Targets(workers), nil, nil, log)
	if err != nil {
		return nil, err
	}
	filterMetrics := filter.NewMetrics(reg)
	watchers := []fleet.Watcher{tracker, scraper, filterMetrics}
	background := []func(ctx context.Context){tracker.Run, scraper.Run}
	var signals router.Signals // a nil *Scraper must not become a non-nil interface
	if spec.EngineSignals {
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
	workerSet, err := fleet.New(workers, fleet.Deps{Index: idx, Router: r, Watchers: watchers, DefaultCapacityBlocks: cfg.Index.CapacityBlocks})
	if err != nil {
		return nil, err
	}
	scraper.ReportCapacity(cfg.Router.BlockSize, workerSet.SetScrapedCapacity)
	fleet.NewMetrics(reg, workerSet)
	scoring.NewMetrics(reg, bookings, func() []string { return names(workerSet.Workers()) })
	index.NewMetrics(reg, idx)
	ext, err := filter.New(cfg.Filter, filter.Deps{Router: r, Policy: policy, Metrics: filterMetrics, Logger: log, Health: tracker})
	if err != nil {
		return nil, err
	}

	grpcServer := grpc.NewServer(append(server.Options(cfg.Filter.MaxBodyBytes), server.Recovery(log, server.NewMetrics(reg))...)...)
	healthServer := grpchealth.NewServer()
	extprocv3.RegisterExternalProcessorServer(grpcServer, ext)
	healthpb.RegisterHealthServer(grpcServer, healthServer)
	process := &server.Process{GRPC: grpcServer, Health: healthServer, Background: background, Grace: cfg.ShutdownGrace, Log: log}
	source, err := newSource(cfg, log, opts)
	if err != nil {
		return nil, err
	}
	runner, err := discovery.NewRunner(cfg.Discovery.Source, source, discovery.RunnerDeps{
		Fleet: workerSet, OnChange: process.Refresh, Metrics: discovery.NewMetrics(reg), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	process.Readiness, process.Background = runner.Ready, append(process.Background, runner.Run)
	// A reload's workers (static source) go through the runner, so readiness and the
	// discovery metrics see them.
	reloader := config.NewReloader(cfg, load, runner, policy, log, config.NewMetrics(reg))

	readOnly := ""
	if !spec.HasCost {
		readOnly = fmt.Sprintf("policy.picker is %s, which has no cost parameters to change", cfg.Policy.Picker)
	}
	policyHandler, err := policyapi.Handler(policyapi.Config{Policy: policy, ReadOnly: readOnly, Logger: log, Metrics: policyapi.NewMetrics(reg)})
	if err != nil {
		return nil, err
	}
	adminHandler, err := admin.Handler(admin.Config{RemoteChanges: cfg.AdminRemoteChanges}, admin.Deps{
		Gatherer: reg, Ready: process.Ready, Policy: policyHandler,
		Reload: func() (any, error) { return reloader.Reload() },
	})
	if err != nil {
		return nil, err
	}
	process.Admin = &http.Server{Handler: adminHandler, ReadHeaderTimeout: 10 * time.Second}
	return &app{registry: reg, bookings: bookings, index: idx, router: r, policy: policy, reloader: reloader, process: process,
		fleet: workerSet, runner: runner}, nil
}

func names(workers []router.Worker) []string {
	out := make([]string, len(workers))
	for i, w := range workers {
		out[i] = w.Name
	}
	return out
}
