// Package enginemodels reads which base models each engine serves and which LoRA
// adapters it has loaded, from its OpenAI-compatible model list (GET /v1/models), so
// that a request goes only to workers that serve its model or adapter. vLLM answers a
// request for a model it does not serve, or an adapter it has not loaded, with 404: in
// a fleet whose workers serve different models, or load different adapters (per-pod
// --lora-modules, or adapters loaded at run time), routing on the config alone loses
// requests. The lists also name adapters the config does not declare, with their base
// models, so adapters loaded at run time route without a config change. A *Lister is
// a router.ModelLists.
package enginemodels

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/internal/secret"
)

// Config is the `engine_models` section of kvroute's config.
type Config struct {
	// Path is the engines' model list on each worker's address.
	Path string `yaml:"path" json:"path"`
	// Interval between two reads of each worker's list; 0 turns the lists off (every
	// worker of a base model is taken to serve its declared adapters).
	Interval time.Duration `yaml:"interval" json:"interval"`
	// Timeout of one read.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// APIKeyFile and APIKeyEnv give the engines' API key (vLLM's --api-key guards
	// /v1/models), sent as Authorization: Bearer: a file holding it, re-read each
	// round so a rotated Secret applies, or an environment variable. At most one.
	APIKeyFile string `yaml:"api_key_file" json:"api_key_file"`
	APIKeyEnv  string `yaml:"api_key_env" json:"api_key_env"`
}

// DefaultConfig reads /v1/models every 10 s with a 2 s timeout: adapters are loaded
// and unloaded in seconds to minutes, and a list read too rarely only means a new
// adapter's first requests may go to every worker of its base model (as without lists).
func DefaultConfig() Config {
	return Config{Path: "/v1/models", Interval: 10 * time.Second, Timeout: 2 * time.Second}
}

// maxInterval bounds the interval: a list older than three of them is forgotten.
const maxInterval = time.Hour

// Validate reports the first invalid field, naming its YAML path, and reads the API key
// once so that a missing Secret is a config error, not a run of 401s.
func (c Config) Validate() error {
	switch {
	case c.Path == "" || c.Path[0] != '/':
		return fmt.Errorf("engine_models.path: must start with /, got %q", c.Path)
	case c.Interval < 0 || c.Interval > maxInterval:
		return fmt.Errorf("engine_models.interval: must be in [0, %s] (0: off), got %s", maxInterval, c.Interval)
	case c.Timeout <= 0:
		return fmt.Errorf("engine_models.timeout: must be > 0, got %s", c.Timeout)
	}
	if err := secret.CheckSources(c.APIKeyFile, c.APIKeyEnv); err != nil {
		return fmt.Errorf("engine_models.%w", err)
	}
	if c.Interval == 0 {
		return nil // off: the key is never sent
	}
	_, err := c.apiKey()
	return err
}

// apiKey returns the configured API key, "" without one. Errors name the key's source,
// never its value.
func (c Config) apiKey() (string, error) {
	key, err := secret.Read(c.APIKeyFile, c.APIKeyEnv)
	if err != nil {
		return "", fmt.Errorf("engine_models.%w", err)
	}
	return key, nil
}

// Deps are a Lister's collaborators; every field may be nil.
type Deps struct {
	// Client reads the lists; nil is a new http.Client. An h2c worker's list is read
	// through a copy of it that speaks h2c (poll.NewClients).
	Client *http.Client
	// Now is the clock that ages the lists; nil is time.Now.
	Now func() time.Time
	// Log gets a warning when a worker's list becomes unreadable or two workers give an
	// adapter different base models; nil discards.
	Log *slog.Logger
	// Registerer gets kvroute_engine_models_*; nil registers nothing.
	Registerer prometheus.Registerer
	// Panics counts the reads that panicked (loop "models"); nil counts nothing.
	Panics *background.Metrics
}

// Lister holds every worker's latest adapter list. Safe for concurrent use: decisions
// read an immutable snapshot without a lock while reads of the lists run.
type Lister struct {
	cfg     Config
	clients poll.Clients
	now     func() time.Time
	log     *slog.Logger
	scrapes *prometheus.CounterVec
	guard   background.Guard // each read's

	// view is what decisions read, replaced whole after each round of reads and each
	// change of the workers.
	view atomic.Pointer[snapshot]

	mu      sync.Mutex
	workers []poll.Target
	lists   map[string]listing
	// failing is each worker's last error, so that a run of failures warns once.
	failing map[string]string
	// conflicts are the adapters whose base models the lists disagreed on at the last
	// rebuild, so that each disagreement warns once.
	conflicts map[string]bool
	// keyErr is the last error reading the API key, warned once per change.
	keyErr string

	// joined wakes Run when workers join: their lists are read at once, not at the
	// next interval (until then they would take any model's requests).
	joined chan struct{}
}

// snapshot is the lists as decisions see them.
type snapshot struct {
	lists map[string]listing
	// bases maps each adapter some fresh list names to its base model; an adapter the
	// lists disagree on, or that some list names as a base model, is left out.
	bases map[string]string
}

// listing is one worker's list and when it was read.
type listing struct {
	adapters       map[string]string
	bases          map[string]struct{}
	contextLengths map[string]int
	at             time.Time
}

// Outcomes of one read, the label of kvroute_engine_models_scrapes_total.
const (
	outcomeOK      = "ok"
	outcomeFailed  = "failed"  // unreachable, not 200, not JSON
	outcomeRefused = "refused" // JSON, but not a list an engine would send (ErrBadList)
)

// New returns a lister of workers' model lists.
func New(cfg Config, workers []poll.Target, deps Deps) (*Lister, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Lister{cfg: cfg, clients: poll.NewClients(deps.Client), now: deps.Now, log: deps.Log, workers: slices.Clone(workers),
		lists: map[string]listing{}, failing: map[string]string{}, conflicts: map[string]bool{}, joined: make(chan struct{}, 1)}
	l.view.Store(&snapshot{})
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.guard = background.NewGuard(background.LoopModels, l.log, deps.Panics)
	l.scrapes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_models_scrapes_total",
		Help: "Reads of the engines' model lists (/v1/models), by outcome: ok, failed (unreachable, not 200, not JSON), refused (not a list an engine sends)."},
		[]string{"outcome"})
	if deps.Registerer != nil {
		deps.Registerer.MustRegister(l.scrapes,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_engine_models_adapters",
				Help: "LoRA adapters the engines' fresh model lists name, over the fleet (an adapter two lists give different base models is left out)."},
				func() float64 { return float64(len(l.view.Load().bases)) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_engine_models_known_lists",
				Help: "Workers whose model list is known (read within 3 intervals and a timeout); the others may serve any adapter of their base model."},
				func() float64 { return float64(l.knownLists()) }))
	}
	return l, nil
}

// Enabled reports whether the lists are read at all (engine_models.interval > 0).
func (l *Lister) Enabled() bool { return l.cfg.Interval > 0 }

// staleAfter is how many missed reads make a list unknown: a worker that stops
// answering is taken, again, to serve whatever its base model's adapters are.
const staleAfter = 3

func (l *Lister) fresh(li listing) bool {
	return l.now().Sub(li.at) <= staleAfter*l.cfg.Interval+l.cfg.Timeout
}

// known returns the worker's list if it is known (read, and fresh): the snapshot holds
// the lists fresh when it was published, and they age until the next one.
func (l *Lister) known(worker string) (listing, bool) {
	li, ok := l.view.Load().lists[worker]
	return li, ok && l.fresh(li)
}

// ServesModel reports whether the worker's engine lists model as a base model it
// serves (a card without a parent, or the parent of a listed adapter), and whether
// its list is known at all (read, and fresh): an unknown list says nothing.
func (l *Lister) ServesModel(worker, model string) (serves, known bool) {
	li, ok := l.known(worker)
	if !ok {
		return false, false
	}
	_, serves = li.bases[model]
	return serves, true
}

// ServesAdapter reports whether the worker's engine lists the adapter as loaded, and
// whether its list is known at all (read, and fresh): an unknown list says nothing.
func (l *Lister) ServesAdapter(worker, adapter string) (serves, known bool) {
	li, ok := l.known(worker)
	if !ok {
		return false, false
	}
	_, serves = li.adapters[adapter]
	return serves, true
}

// ContextLength returns the context length (max_model_len) the worker's engine lists
// for model, a base model, and whether its list is known and gives one for that model.
func (l *Lister) ContextLength(worker, model string) (int, bool) {
	li, ok := l.known(worker)
	if !ok {
		return 0, false
	}
	n, ok := li.contextLengths[model]
	return n, ok
}

// ContextLengths returns a copy of the contexts (max_model_len) the worker's engine
// lists, by model, and whether its list is known at all, for the admin port's fleet
// view.
func (l *Lister) ContextLengths(worker string) (map[string]int, bool) {
	li, ok := l.known(worker)
	if !ok {
		return nil, false
	}
	return maps.Clone(li.contextLengths), true
}

// Adapters returns the adapters the worker's engine lists, sorted, and whether its list
// is known at all (read, and fresh), for the admin port's fleet view.
func (l *Lister) Adapters(worker string) ([]string, bool) {
	li, ok := l.known(worker)
	if !ok {
		return nil, false
	}
	return slices.Sorted(maps.Keys(li.adapters)), true
}

// Models returns the base models the worker's engine lists, sorted, and whether its
// list is known at all (read, and fresh), for the admin port's fleet view.
func (l *Lister) Models(worker string) ([]string, bool) {
	li, ok := l.known(worker)
	if !ok {
		return nil, false
	}
	return slices.Sorted(maps.Keys(li.bases)), true
}

// BaseOf returns the base model the engines' lists give the adapter, false when no
// fresh list names it, two give it different base models, or one serves it as a base
// model.
func (l *Lister) BaseOf(adapter string) (string, bool) {
	base, ok := l.view.Load().bases[adapter]
	return base, ok
}

func (l *Lister) knownLists() int {
	n := 0
	for _, li := range l.view.Load().lists {
		if l.fresh(li) {
			n++
		}
	}
	return n
}

// SetWorkers replaces the workers (a reload, a discovery change); the lists of removed
// ones, and of ones whose address changed (a restarted pod that kept its name), are
// forgotten at once. Run reads the lists of the ones that joined (or moved) at once.
func (l *Lister) SetWorkers(workers []poll.Target) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := map[string]string{}
	for _, w := range workers {
		keep[w.Name] = w.Address
	}
	before := make(map[poll.Target]bool, len(l.workers))
	for _, w := range l.workers {
		before[w] = true
		if address, ok := keep[w.Name]; !ok || address != w.Address {
			delete(l.lists, w.Name)
			delete(l.failing, w.Name)
		}
	}
	joined := slices.ContainsFunc(workers, func(w poll.Target) bool { return !before[w] })
	l.workers = slices.Clone(workers)
	l.publish()
	if joined {
		select {
		case l.joined <- struct{}{}:
		default: // a read of the unread lists is already due
		}
	}
}

// Run reads every worker's list each interval, and the lists of workers that join as
// they join, until ctx is done; with the lists off it returns at once.
func (l *Lister) Run(ctx context.Context) {
	if !l.Enabled() {
		return
	}
	tick := time.NewTicker(l.cfg.Interval)
	defer tick.Stop()
	l.ReadAll(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			l.ReadAll(ctx)
		case <-l.joined:
			l.readWorkers(ctx, true)
		}
	}
}

// ReadAll reads every worker's list once (poll.Each: concurrently, within its bound),
// then publishes them.
func (l *Lister) ReadAll(ctx context.Context) { l.readWorkers(ctx, false) }

// readWorkers reads the workers' lists, only those never read (nor failed) since they
// joined when unread is set, then publishes them. A read that panics (a bug its list
// reached) is recovered, logged and counted (kvroute_background_panics_total{loop=
// "models"}), and is a failed read of that worker's list: its last list ages out.
func (l *Lister) readWorkers(ctx context.Context, unread bool) {
	key, keyErr := l.cfg.apiKey()
	l.mu.Lock()
	workers := l.workers
	if unread {
		workers = slices.DeleteFunc(slices.Clone(workers), func(w poll.Target) bool {
			_, read := l.lists[w.Name]
			_, failed := l.failing[w.Name]
			return read || failed
		})
	}
	if msg := errText(keyErr); msg != l.keyErr {
		if keyErr != nil {
			l.log.Warn("engine model lists: API key unreadable, reading without it", "error", keyErr)
		}
		l.keyErr = msg
	}
	l.mu.Unlock()
	poll.Each(ctx, workers, func(ctx context.Context, w poll.Target) {
		var list List
		err := l.guard.Do(func() (err error) {
			list, err = l.read(ctx, w, key)
			return err
		})
		l.record(ctx, w, list, err)
	})
	l.mu.Lock()
	l.publish()
	l.mu.Unlock()
}

// maxBody bounds one list: a thousand cards is well under a megabyte.
const maxBody = 4 << 20

func (l *Lister) read(ctx context.Context, w poll.Target, key string) (List, error) {
	req := "http://" + w.Address + l.cfg.Path
	header, body, err := poll.GetWith(ctx, l.clients.For(w), req, l.cfg.Timeout, func(r *http.Request) {
		r.Header.Set("Accept", "application/json")
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
	})
	if err != nil {
		return List{}, err
	}
	defer body.Close()
	contentType := header.Get("Content-Type")
	if mediaType, _, err := mime.ParseMediaType(contentType); err != nil || mediaType != "application/json" {
		// Quoted and cut: the header is the engine's, and reaches a log line.
		return List{}, fmt.Errorf("content type %.64q: want application/json", contentType)
	}
	page, err := io.ReadAll(io.LimitReader(body, maxBody+1))
	if err != nil {
		return List{}, err
	}
	if len(page) > maxBody {
		return List{}, fmt.Errorf("%w: more than %d bytes", ErrBadList, maxBody)
	}
	return Parse(page)
}

// record keeps w's list, or on an error warns once per change of error and leaves the
// last list to age out.
func (l *Lister) record(ctx context.Context, w poll.Target, list List, err error) {
	outcome := outcomeOK
	switch {
	case errors.Is(err, ErrBadList):
		outcome = outcomeRefused
	case err != nil:
		outcome = outcomeFailed
	}
	if ctx.Err() != nil && err != nil {
		return // shutting down: not the engine's fault
	}
	l.scrapes.WithLabelValues(outcome).Inc()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.workers, w) { // removed or moved while this read ran
		return
	}
	if msg := errText(err); msg != l.failing[w.Name] {
		if err != nil {
			l.log.Warn("engine model list unreadable: the worker counts as serving every adapter of its base model until it reads again", "worker", w.Name, "error", err)
		}
		l.failing[w.Name] = msg
	}
	if err == nil {
		delete(l.failing, w.Name)
		// An adapter's parent is a base model the engine serves too, listed or not
		// (vLLM lists its served names; an engine may list only the adapters' parent).
		for _, parent := range list.Adapters {
			list.Bases[parent] = struct{}{}
		}
		l.lists[w.Name] = listing{adapters: list.Adapters, bases: list.Bases, contextLengths: list.ContextLengths, at: l.now()}
	}
}

// publish makes the decisions' snapshot from the fresh lists: a copy of them, and
// adapter → base model over them, warning of each newly conflicting name. l.mu is held.
func (l *Lister) publish() {
	lists := make(map[string]listing, len(l.lists))
	servedAsBase := map[string]bool{}
	for name, li := range l.lists {
		if !l.fresh(li) {
			continue
		}
		lists[name] = li
		for base := range li.bases {
			servedAsBase[base] = true
		}
	}
	bases, parents := map[string]string{}, map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(lists)) {
		for adapter, base := range lists[name].adapters {
			if !slices.Contains(parents[adapter], base) {
				parents[adapter] = append(parents[adapter], base)
			}
		}
	}
	conflicts := map[string]bool{}
	for adapter, ps := range parents {
		switch {
		case servedAsBase[adapter]:
			// Some engine serves the name as a base model: a request naming it is that
			// model, not another engine's adapter.
		case len(ps) > 1:
			conflicts[adapter] = true
			if !l.conflicts[adapter] {
				l.log.Warn("engine model lists disagree on an adapter's base model: it routes only if lora_adapters declares it", "adapter", adapter, "base_models", ps)
			}
		default:
			bases[adapter] = ps[0]
		}
	}
	l.conflicts = conflicts
	l.view.Store(&snapshot{lists: lists, bases: bases})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
