package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/router"
)

// buildOption changes what build wires; tests use them to stand in for a cluster.
type buildOption func(*buildOptions)

type buildOptions struct {
	kubeClients *kube.Clients
	kubeResync  time.Duration
	// rewrites hears the pool's InferenceModelRewrites (set by buildDiscovery).
	rewrites kube.RewriteSink
}

// withKubeClients makes the kubernetes source read through clients (fakes, in tests)
// and resync every resync.
func withKubeClients(clients *kube.Clients, resync time.Duration) buildOption {
	return func(o *buildOptions) { o.kubeClients, o.kubeResync = clients, resync }
}

// newSource builds the worker discovery source discovery.source names, counting the
// syncs that panicked in panics; a Kubernetes source also tells objectives the pool's
// InferenceObjectives (nil: not watched).
func newSource(cfg config.Config, log *slog.Logger, panics *background.Metrics, opts buildOptions, objectives kube.ObjectiveSink) (discovery.Source, error) {
	if err := cfg.Discovery.CheckBlockSize(cfg.Router.BlockSize); err != nil {
		return nil, err
	}
	switch cfg.Discovery.Source {
	case discovery.SourceFile:
		f, err := discovery.NewFile(cfg.Discovery.File.Path, cfg.Router.LoRAAdapters, log)
		if err != nil {
			return nil, err
		}
		f.CountPanics(panics)
		return f, nil
	case discovery.SourceKubernetes:
		return kube.New(cfg.Discovery.Kubernetes, kube.Deps{Clients: opts.kubeClients, Resync: opts.kubeResync,
			LoRAAdapters: cfg.Router.LoRAAdapters, Objectives: objectives, Rewrites: opts.rewrites, Panics: panics, Logger: log})
	}
	return discovery.NewStatic(cfg.Router.Workers), nil
}

// describeWorkers says where the workers come from, for `extproc validate`; a workers
// file is read and validated too.
func describeWorkers(cfg config.Config) (string, error) {
	switch d := cfg.Discovery; d.Source {
	case discovery.SourceFile:
		workers, err := discovery.ReadWorkersFile(d.File.Path, cfg.Router.LoRAAdapters)
		if err != nil {
			return "", err
		}
		// The file is read without the block size; the fleet checks its entries with
		// it (kv_events.offload_block_size) when kvroute starts.
		if err := (router.Config{BlockSize: cfg.Router.BlockSize, Workers: workers, LoRAAdapters: cfg.Router.LoRAAdapters}).Validate(); err != nil {
			return "", fmt.Errorf("discovery.file.path: %s: %w", d.File.Path, err)
		}
		return fmt.Sprintf("%d workers in %s", len(workers), d.File.Path), nil
	case discovery.SourceKubernetes:
		if err := d.CheckBlockSize(cfg.Router.BlockSize); err != nil {
			return "", err
		}
		namespace := d.Kubernetes.Namespace
		if namespace == "" {
			namespace = "its own namespace"
		}
		return fmt.Sprintf("workers from InferencePool %s in %s", d.Kubernetes.Pool, namespace), nil
	}
	return fmt.Sprintf("%d workers", len(cfg.Router.Workers)), nil
}
