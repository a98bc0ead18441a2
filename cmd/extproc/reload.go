package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/kvroute/kvroute/router"
)

// reloadSummary is what a reload changed.
type reloadSummary struct {
	Workers int      `json:"workers"`
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Changed []string `json:"changed"`
	// Policy is true when the file's policy section changed and replaced the policy in
	// force, runtime updates included. A reload that leaves the section as it was keeps
	// runtime updates.
	Policy bool `json:"policy"`
}

// reload reads the config again and applies its workers and policy parameters. Every
// other key needs a restart: a file that changes one is refused whole, as is a file
// that does not validate, and the running config stays.
func (a *app) reload() (reloadSummary, error) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	summary, err := a.reloadLocked()
	result := "applied"
	if err != nil {
		result = "rejected"
		a.log.Error("config reload rejected", "error", err)
	} else {
		a.log.Info("config reloaded", "workers", summary.Workers, "added", summary.Added,
			"removed", summary.Removed, "changed", summary.Changed, "policy", summary.Policy)
	}
	a.reloads.WithLabelValues(result).Inc()
	return summary, err
}

func (a *app) reloadLocked() (reloadSummary, error) {
	if a.load == nil {
		return reloadSummary{}, errors.New("reload: this server was not started from a config file")
	}
	next, err := a.load()
	if err != nil {
		return reloadSummary{}, fmt.Errorf("reload: %w", err)
	}
	if keys := restartKeys(a.cfg, next); len(keys) > 0 {
		return reloadSummary{}, fmt.Errorf("reload: %s changed: restart kvroute to apply (nothing was changed)", strings.Join(keys, ", "))
	}
	old := make(map[string]router.Worker, len(a.cfg.Router.Workers))
	for _, w := range a.cfg.Router.Workers {
		old[w.Name] = w
	}
	summary := reloadSummary{Workers: len(next.Router.Workers)}
	// New and changed workers first: the index must know a worker before a decision
	// can record blocks on it.
	kept := map[string]bool{}
	for _, w := range next.Router.Workers {
		kept[w.Name] = true
		prev, existed := old[w.Name]
		switch {
		case !existed:
			summary.Added = append(summary.Added, w.Name)
		case !reflect.DeepEqual(prev, w):
			summary.Changed = append(summary.Changed, w.Name)
		default:
			continue
		}
		if err := a.index.SetWorker(w.Name, w.CapacityBlocks); err != nil {
			return reloadSummary{}, fmt.Errorf("reload: %w", err)
		}
		if existed && prev.Address != w.Address {
			// Another address is another engine: what the old one cached is not there.
			_ = a.index.Clear(w.Name)
		}
	}
	targets := pollTargets(next.Router.Workers)
	a.tracker.SetWorkers(targets)
	if a.scraper != nil {
		a.scraper.SetWorkers(targets)
	}
	if err := a.router.SetWorkers(next.Router.Workers); err != nil {
		return reloadSummary{}, fmt.Errorf("reload: %w", err) // validated above; not expected
	}
	// Removed workers last: no decision chooses them now. Requests already on them
	// release their bookings when they end.
	for _, w := range a.cfg.Router.Workers {
		if !kept[w.Name] {
			summary.Removed = append(summary.Removed, w.Name)
			a.index.RemoveWorker(w.Name)
		}
	}
	if next.Policy.Params != a.cfg.Policy.Params {
		if err := a.policy.Set(next.Policy.Params); err != nil {
			return reloadSummary{}, fmt.Errorf("reload: policy.%w", err)
		}
		summary.Policy = true
	}
	a.cfg = next
	return summary, nil
}

// restartKeys names the keys that differ between two configs and cannot change without
// a restart: everything but the workers and the policy's cost parameters.
func restartKeys(running, next config) []string {
	var keys []string
	for _, f := range []struct {
		key       string
		was, will any
	}{
		{"grpc_address", running.GRPCAddress, next.GRPCAddress},
		{"admin_address", running.AdminAddress, next.AdminAddress},
		{"admin_remote_changes", running.AdminRemoteChanges, next.AdminRemoteChanges},
		{"shutdown_grace", running.ShutdownGrace, next.ShutdownGrace},
		{"log_level", running.LogLevel, next.LogLevel},
		{"block_size", running.Router.BlockSize, next.Router.BlockSize},
		{"max_active_requests_per_worker", running.Router.MaxActiveRequestsPerWorker, next.Router.MaxActiveRequestsPerWorker},
		{"the filter keys (destination_header, max_body_bytes, *_paths, *_body_mode, fallback_endpoints)", running.Filter, next.Filter},
		{"policy.picker", running.Policy.Picker, next.Policy.Picker},
		{"policy.seed", running.Policy.Seed, next.Policy.Seed},
		{"index", running.Index, next.Index},
		{"health", running.Health, next.Health},
		{"engine_metrics", running.EngineMetrics, next.EngineMetrics},
	} {
		if !reflect.DeepEqual(f.was, f.will) {
			keys = append(keys, f.key)
		}
	}
	return keys
}
