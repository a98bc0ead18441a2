package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// Fleet is where a reload's workers go. *fleet.Fleet satisfies it.
type Fleet interface {
	Apply(workers []router.Worker) (fleet.Diff, error)
	Workers() []router.Worker
}

// Secrets are read again at each reload: what the config names whose content may
// change while the file does not (the engine render API keys). *models.Set satisfies
// it.
type Secrets interface {
	// ReadAPIKeys reads them all; apply puts them in force. An error changes nothing.
	ReadAPIKeys() (apply func(), err error)
}

// Objectives is where a reload's priority.objectives go. *priority.Objectives
// satisfies it.
type Objectives interface {
	SetConfigured(objectives map[string]int)
}

// ModelRewrites is where a reload's model_rewrites go. *rewrite.Table satisfies it.
type ModelRewrites interface {
	SetConfigured(rewrite.Config)
}

// Summary is what a reload changed.
type Summary struct {
	fleet.Diff
	// Policy is true when the file's policy section changed and replaced the policy in
	// force, runtime updates included. A reload that leaves the section as it was keeps
	// runtime updates.
	Policy bool `json:"policy"`
	// Objectives is true when the file's priority.objectives changed and replaced the
	// ones in force.
	Objectives bool `json:"objectives"`
	// ModelRewrites is true when the file's model_rewrites changed and replaced the
	// ones in force.
	ModelRewrites bool `json:"model_rewrites"`
}

// Reloader re-reads the config file and applies what may change without a restart:
// the workers, the policy's cost parameters, the priority objectives, the model
// rewrites and the secrets the config names. Safe for concurrent use; one reload runs at a time.
type Reloader struct {
	load       func() (Config, error)
	fleet      Fleet
	policy     *scoring.Policy
	secrets    Secrets
	objectives Objectives
	rewrites   ModelRewrites
	log        *slog.Logger
	metrics    *Metrics

	mu      sync.Mutex
	running Config
}

// Targets are where a reload's parts go. Fleet and Policy are required; a nil
// Objectives, Rewrites or Secrets takes none of its part.
type Targets struct {
	Fleet      Fleet
	Policy     *scoring.Policy
	Objectives Objectives    // priority.objectives
	Rewrites   ModelRewrites // model_rewrites
	Secrets    Secrets       // read again at each reload
}

// NewReloader returns a reloader of the config running, read again by load (nil:
// reloads are refused), applying each part to its target.
func NewReloader(running Config, load func() (Config, error), to Targets, log *slog.Logger, m *Metrics) *Reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reloader{load: load, fleet: to.Fleet, policy: to.Policy, objectives: to.Objectives, rewrites: to.Rewrites,
		secrets: to.Secrets, log: log, metrics: m, running: running}
}

// Running returns the config in force: the one started with, or the last reload's.
func (r *Reloader) Running() Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Reload reads the config again and applies its workers and policy parameters, and
// reads the secrets again (a rotated API key file). Every other key needs a restart: a
// file that changes one is refused whole, as is a file that does not validate or a
// secret that cannot be read, and the running config stays. The outcome is logged and
// counted.
func (r *Reloader) Reload() (Summary, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	summary, err := r.reloadLocked()
	if err != nil {
		r.metrics.reloaded("rejected")
		r.log.Error("config reload rejected", "error", err)
		return summary, err
	}
	r.metrics.reloaded("applied")
	// Empty lists, not nil: the admin port answers with the summary, and a client
	// iterating "added" should find [] rather than null.
	for _, l := range []*[]string{&summary.Added, &summary.Removed, &summary.Changed} {
		if *l == nil {
			*l = []string{}
		}
	}
	r.log.Info("config reloaded", "workers", summary.Workers, "added", summary.Added,
		"removed", summary.Removed, "changed", summary.Changed, "policy", summary.Policy, "objectives", summary.Objectives, "model_rewrites", summary.ModelRewrites)
	return summary, nil
}

func (r *Reloader) reloadLocked() (Summary, error) {
	if r.load == nil {
		return Summary{}, errors.New("reload: this server was not started from a config file")
	}
	next, err := r.load()
	if err != nil {
		return Summary{}, fmt.Errorf("reload: %w", err)
	}
	if keys := RestartKeys(r.running, next); len(keys) > 0 {
		return Summary{}, fmt.Errorf("reload: %s changed: restart kvroute to apply (nothing was changed)", strings.Join(keys, ", "))
	}
	// Everything that can refuse the file is checked before anything is applied: a
	// reload changes all it says or nothing.
	policyChanged := next.Policy.Params != r.running.Policy.Params
	if policyChanged {
		if err := next.Policy.Params.Validate(); err != nil {
			return Summary{}, fmt.Errorf("reload: policy.%w (nothing was changed)", err)
		}
	}
	applySecrets := func() {}
	if r.secrets != nil {
		if applySecrets, err = r.secrets.ReadAPIKeys(); err != nil {
			return Summary{}, fmt.Errorf("reload: %w (nothing was changed)", err)
		}
	}
	// Discovered workers (file, kubernetes) follow their source, not the config file.
	diff := fleet.Diff{Workers: len(r.fleet.Workers())}
	if next.Discovery.Source == discovery.SourceStatic {
		if diff, err = r.fleet.Apply(next.Router.Workers); err != nil {
			return Summary{}, fmt.Errorf("reload: %w", err)
		}
	}
	summary := Summary{Diff: diff}
	if policyChanged {
		if err := r.policy.Set(next.Policy.Params); err != nil {
			// Not reached: Set validates as above.
			return summary, fmt.Errorf("reload: policy.%w", err)
		}
		summary.Policy = true
	}
	if r.objectives != nil && !maps.Equal(next.Priority.Objectives, r.running.Priority.Objectives) {
		r.objectives.SetConfigured(next.Priority.Objectives)
		summary.Objectives = true
	}
	if r.rewrites != nil && !reflect.DeepEqual(nilIfNoRewrites(next.ModelRewrites), nilIfNoRewrites(r.running.ModelRewrites)) {
		r.rewrites.SetConfigured(next.ModelRewrites)
		summary.ModelRewrites = true
	}
	applySecrets()
	r.running = next
	return summary, nil
}

// ReloadOn reloads at each signal received (SIGHUP) until ctx ends. Outcomes are logged
// and counted by Reload.
func (r *Reloader) ReloadOn(ctx context.Context, signals <-chan os.Signal) {
	for {
		select {
		case <-signals:
			_, _ = r.Reload()
		case <-ctx.Done():
			return
		}
	}
}

// nilIfNoRewrites makes an empty model_rewrites list equal to an absent one.
func nilIfNoRewrites(c rewrite.Config) rewrite.Config {
	if len(c) == 0 {
		return nil
	}
	return c
}
