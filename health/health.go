package health

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/poll"
)

// Config is the `health` section of kvroute's config.
type Config struct {
	// Path is the workers' health endpoint, probed with GET (vLLM and SGLang: /health).
	Path string `yaml:"path" json:"path"`
	// Interval between probes of each worker; 0 turns active probing off (only upstream
	// 5xx responses then count as failures).
	Interval time.Duration `yaml:"interval" json:"interval"`
	// Timeout of one probe.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// UnhealthyThreshold consecutive failures take a healthy worker out.
	UnhealthyThreshold int `yaml:"unhealthy_threshold" json:"unhealthy_threshold"`
	// BackoffMin is the first back-off; each failure while out doubles it up to
	// BackoffMax, and so does going out again within BackoffMax of rejoining.
	BackoffMin time.Duration `yaml:"backoff_min" json:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max" json:"backoff_max"`
}

// DefaultConfig probes /health every 2 s with a 1 s timeout and takes a worker out after
// 2 consecutive failures for 2 s, doubling to at most 1 min.
func DefaultConfig() Config {
	return Config{Path: "/health", Interval: 2 * time.Second, Timeout: time.Second,
		UnhealthyThreshold: 2, BackoffMin: 2 * time.Second, BackoffMax: time.Minute}
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("health.interval: must be ≥ 0, got %s", c.Interval)
	case c.Interval > 0 && (c.Path == "" || c.Path[0] != '/'):
		return fmt.Errorf("health.path: must start with /, got %q", c.Path)
	case c.Interval > 0 && c.Timeout <= 0:
		return fmt.Errorf("health.timeout: must be > 0, got %s", c.Timeout)
	case c.UnhealthyThreshold < 1:
		return fmt.Errorf("health.unhealthy_threshold: must be ≥ 1, got %d", c.UnhealthyThreshold)
	case c.BackoffMin <= 0:
		return fmt.Errorf("health.backoff_min: must be > 0, got %s", c.BackoffMin)
	case c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("health.backoff_max: must be ≥ backoff_min (%s), got %s", c.BackoffMin, c.BackoffMax)
	}
	return nil
}

// Worker is a worker to track: its name, the ip:port its health endpoint is on, and
// whether it is probed over h2c.
type Worker = poll.Target

// Deps are a Tracker's collaborators; all are optional.
type Deps struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Client sends the probes; nil means a new http.Client (each probe carries its own
	// timeout). An h2c worker's go through a copy of it that speaks h2c
	// (poll.NewClients).
	Client *http.Client
	// OnDown is called, outside the tracker's lock, each time a worker is taken out.
	OnDown func(worker string)
	// Metrics receives the kvroute_worker_* series; nil records nothing.
	Metrics *Metrics
	// Panics counts the probes that panicked (loop "health"); nil counts nothing.
	Panics *background.Metrics
	Logger *slog.Logger
}

// Tracker holds every worker's health. Its methods are safe for concurrent use.
type Tracker struct {
	cfg     Config
	deps    Deps
	clients poll.Clients
	guard   background.Guard // each probe's

	mu      sync.Mutex
	workers []Worker // probed each interval
	state   map[string]*state
	// address is each worker's address now: a probe's answer counts only while the
	// worker is still at the address probed.
	address map[string]string
	// outCount is how many workers are out: the router asks Eligible for every candidate
	// of every decision, and while none is out the answer needs no lock and no clock.
	outCount atomic.Int32
}

// state is one worker's health. An out worker is not chosen before outUntil; after
// that it rejoins once healthy: on a successful probe, or, without probes, on trial.
type state struct {
	failures  int // consecutive
	out       bool
	outUntil  time.Time
	backoff   time.Duration
	recovered bool // out, but the last probe or response succeeded
	// lastBackoff and rejoined are the back-off of the worker's last time out and when
	// it came back: a worker that goes out again within backoff_max of rejoining (one
	// that passes probes but fails requests, or flaps) is out twice as long as last
	// time, not backoff_min again.
	lastBackoff time.Duration
	rejoined    time.Time
}

// Failure sources, the `source` label of kvroute_worker_health_failures_total.
const (
	SourceProbe    = "probe"
	SourceResponse = "response"
)

// New returns a tracker with every worker healthy.
func New(cfg Config, workers []Worker, deps Deps) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{cfg: cfg, deps: deps, clients: poll.NewClients(deps.Client), guard: background.NewGuard(background.LoopHealth, deps.Logger, deps.Panics), workers: slices.Clone(workers), state: make(map[string]*state, len(workers)),
		address: make(map[string]string, len(workers))}
	for _, w := range workers {
		t.state[w.Name] = &state{}
		t.address[w.Name] = w.Address
		deps.Metrics.setEligible(w.Name, true)
	}
	return t, nil
}

// Eligible reports whether a worker may be chosen now: it is healthy, or its back-off
// has ended and it has answered since (without probes: it rejoins on trial). Unknown
// workers are eligible: the tracker only excludes what it has seen fail.
func (t *Tracker) Eligible(name string) bool {
	if t.outCount.Load() == 0 {
		return true
	}
	now := t.deps.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.state[name]
	if !ok || !s.out {
		return true
	}
	if now.Before(s.outUntil) {
		return false
	}
	if s.recovered {
		t.rejoinLocked(name, s, now)
		return true
	}
	return t.cfg.Interval == 0
}

// Observe reports the HTTP status a worker answered a routed request with, sent to
// address (its ip:port when routed; "" when not known): 5xx is a failure, 2xx a
// success; anything else (a client's 4xx) says nothing of the worker. A response from
// an address the worker has left (a pod restarted under its name, whose old engine
// failed the requests still on it) says nothing of the engine now at its new one.
func (t *Tracker) Observe(name, address string, status int) {
	switch {
	case status >= 500 && status < 600:
		t.fail(name, address, SourceResponse, fmt.Sprintf("status %d", status))
	case status >= 200 && status < 300:
		t.succeed(name, address)
	}
}

// tracked returns the state of a worker tracked now, at address unless address is ""
// (not known); nil otherwise: a probe of a removed worker, or
// of the address a worker left (another engine), says nothing of it. t.mu is held.
func (t *Tracker) tracked(name, address string) *state {
	if address != "" && t.address[name] != address {
		return nil
	}
	return t.state[name]
}

func (t *Tracker) succeed(name, address string) {
	now := t.deps.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.tracked(name, address)
	if s == nil {
		return
	}
	s.failures = 0
	if !s.out {
		return
	}
	// An out worker stays out until its back-off ends, then rejoins.
	s.recovered = true
	if !now.Before(s.outUntil) {
		t.rejoinLocked(name, s, now)
	}
}

func (t *Tracker) rejoinLocked(name string, s *state, now time.Time) {
	*s = state{lastBackoff: s.backoff, rejoined: now}
	t.outCount.Add(-1)
	t.deps.Metrics.setEligible(name, true)
	t.deps.Logger.Info("worker back in", "worker", name)
}

func (t *Tracker) fail(name, address, source, reason string) {
	now := t.deps.Now()
	t.mu.Lock()
	s := t.tracked(name, address)
	if s == nil {
		t.mu.Unlock()
		return
	}
	t.deps.Metrics.failed(name, source)
	s.failures++
	s.recovered = false
	wentOut := false
	switch {
	case s.out && !now.Before(s.outUntil):
		// Still failing when its back-off ended: out again, for twice as long.
		s.backoff = min(2*s.backoff, t.cfg.BackoffMax)
		s.outUntil = now.Add(s.backoff)
		wentOut = true
	case !s.out && s.failures >= t.cfg.UnhealthyThreshold:
		s.out, s.backoff = true, t.cfg.BackoffMin
		if s.lastBackoff > 0 && now.Sub(s.rejoined) < t.cfg.BackoffMax {
			// Out again soon after it came back: it did not recover.
			s.backoff = min(2*s.lastBackoff, t.cfg.BackoffMax)
		}
		t.outCount.Add(1)
		s.outUntil = now.Add(s.backoff)
		wentOut = true
	}
	backoff := s.backoff
	if wentOut {
		t.deps.Metrics.setEligible(name, false) // under the lock, so a reload cannot race it
	}
	t.mu.Unlock()
	if wentOut {
		t.deps.Logger.Warn("worker out", "worker", name, "source", source, "reason", reason, "backoff", backoff.String())
		if t.deps.OnDown != nil {
			t.deps.OnDown(name)
		}
	}
}

// Run probes every worker each interval until ctx is done. With a zero interval it
// returns at once.
func (t *Tracker) Run(ctx context.Context) {
	if t.cfg.Interval == 0 {
		return
	}
	poll.Every(ctx, t.cfg.Interval, t.ProbeAll)
}

// SetWorkers replaces the tracked workers (a config reload): new ones start healthy,
// removed ones are forgotten with their metric series, and a worker that kept its name
// and address keeps its health (a new address is a new engine: it starts healthy).
func (t *Tracker) SetWorkers(workers []Worker) {
	t.mu.Lock()
	defer t.mu.Unlock()
	address := t.address // the addresses before
	t.address = make(map[string]string, len(workers))
	keep := make(map[string]bool, len(workers))
	for _, w := range workers {
		keep[w.Name] = true
		t.address[w.Name] = w.Address
		s, ok := t.state[w.Name]
		switch {
		case !ok:
			t.state[w.Name] = &state{}
			t.deps.Metrics.setEligible(w.Name, true)
		case address[w.Name] != w.Address:
			if s.out {
				t.outCount.Add(-1)
			}
			*s = state{}
			t.deps.Metrics.setEligible(w.Name, true)
		}
	}
	for name, s := range t.state {
		if keep[name] {
			continue
		}
		if s.out {
			t.outCount.Add(-1)
		}
		delete(t.state, name)
		t.deps.Metrics.forget(name)
	}
	t.workers = slices.Clone(workers)
}

// ProbeAll probes every worker once (poll.Each: concurrently, within its bound) and
// records the results. A probe that panics (a bug its answer reached) is recovered,
// logged and counted (kvroute_background_panics_total{loop="health"}), and is a
// failed probe of that worker alone.
func (t *Tracker) ProbeAll(ctx context.Context) {
	t.mu.Lock()
	workers := t.workers
	t.mu.Unlock()
	poll.Each(ctx, workers, func(ctx context.Context, w Worker) {
		if err := t.guard.Do(func() error { return t.probe(ctx, w) }); err != nil {
			if ctx.Err() == nil {
				t.fail(w.Name, w.Address, SourceProbe, err.Error())
			}
			return
		}
		t.succeed(w.Name, w.Address)
	})
}

func (t *Tracker) probe(ctx context.Context, w Worker) error {
	_, body, err := poll.Get(ctx, t.clients.For(w), "http://"+w.Address+t.cfg.Path, t.cfg.Timeout, "")
	if err != nil {
		return err
	}
	return body.Close()
}
