package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Ledger is where the peers' summed counts go: scoring.Bookings.
type Ledger interface {
	// SetPeerLoad records the load other replicas booked on worker; a zero Load
	// forgets it.
	SetPeerLoad(worker string, l scoring.Load)
}

// Resolver looks up the DNS name's addresses (net.Resolver).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Deps are what an [Exchange] uses. Ledger and Replica are required.
type Deps struct {
	Ledger Ledger
	// Replica is this process's id, as its [Handler] serves it.
	Replica string
	// Client polls the peers; nil uses one that follows no redirects.
	Client *http.Client
	// Resolver looks up Config.DNS; nil uses net.DefaultResolver.
	Resolver Resolver
	// Now is the clock; nil uses time.Now.
	Now     func() time.Time
	Metrics *Metrics
	Logger  *slog.Logger
}

// Exchange polls the peers' reports and keeps the ledger's peer load at their sum.
type Exchange struct {
	cfg  Config
	deps Deps

	// Guarded by mu: Run's rounds are sequential, but tests and Peers read it.
	mu         sync.Mutex
	heard      map[string]heard // by address: the last report a peer answered with
	self       map[string]bool  // addresses that answered with this replica's id
	resolved   []string         // the DNS name's addresses at the last lookup
	resolvedAt time.Time
	applied    map[string]bool // workers the ledger holds peer load for
}

// heard is a peer's last accepted report and when it came.
type heard struct {
	report Report
	at     time.Time
	live   bool // counted in the last sum (for logging the changes only)
}

// New returns the exchange for cfg; call [Exchange.Run] to poll.
func New(cfg Config, deps Deps) (*Exchange, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Ledger == nil || deps.Replica == "" {
		return nil, errors.New("peers: Ledger and Replica are required")
	}
	if deps.Client == nil {
		deps.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if deps.Resolver == nil {
		deps.Resolver = net.DefaultResolver
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	return &Exchange{cfg: cfg, deps: deps, heard: map[string]heard{}, self: map[string]bool{}, applied: map[string]bool{}}, nil
}

// Run polls every Config.Interval until ctx ends. Peer load already given to the
// ledger is withdrawn when it returns.
func (e *Exchange) Run(ctx context.Context) {
	tick := time.NewTicker(e.cfg.Interval)
	defer tick.Stop()
	for {
		e.round(ctx)
		select {
		case <-ctx.Done():
			e.withdraw()
			return
		case <-tick.C:
		}
	}
}

// round polls every peer once, at most Config.Interval each and all at once, then
// gives the ledger the sum of the reports still fresh.
func (e *Exchange) round(ctx context.Context) {
	addresses := e.addresses(ctx)
	reports := make([]*Report, len(addresses))
	var wg sync.WaitGroup
	for i, addr := range addresses {
		wg.Go(func() {
			r, err := e.poll(ctx, addr)
			e.deps.Metrics.polled(err)
			if err != nil {
				e.deps.Logger.Debug("peer poll failed", "peer", addr, "err", err)
				return
			}
			reports[i] = &r
		})
	}
	wg.Wait()
	now := e.deps.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, r := range reports {
		switch {
		case r == nil:
		case r.Replica == e.deps.Replica:
			e.self[addresses[i]] = true
			delete(e.heard, addresses[i])
		default:
			e.heard[addresses[i]] = heard{report: *r, at: now, live: e.heard[addresses[i]].live}
		}
	}
	e.apply(now, addresses)
}

// addresses returns the peers to poll: the static list and the DNS name's addresses
// (looked up again every Config.ResolveInterval; a failed lookup keeps the last
// answer), without this replica's own.
func (e *Exchange) addresses(ctx context.Context) []string {
	e.mu.Lock()
	due := e.cfg.DNS != "" && (e.resolvedAt.IsZero() || e.deps.Now().Sub(e.resolvedAt) >= e.cfg.ResolveInterval)
	e.mu.Unlock()
	if due {
		resolved, err := e.resolve(ctx)
		e.mu.Lock()
		e.resolvedAt = e.deps.Now()
		if err != nil {
			e.deps.Logger.Warn("peers: DNS lookup failed; polling the addresses last found", "dns", e.cfg.DNS, "err", err)
		} else {
			e.resolved = resolved
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, a := range slices.Concat(e.cfg.Addresses, e.resolved) {
		if !e.self[a] && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func (e *Exchange) resolve(ctx context.Context) ([]string, error) {
	host, port, _ := net.SplitHostPort(e.cfg.DNS) // validated
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StaleAfter)
	defer cancel()
	ips, err := e.deps.Resolver.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	slices.Sort(ips)
	if len(ips) > MaxAddresses {
		e.deps.Logger.Warn("peers: DNS answer has more addresses than are polled", "dns", e.cfg.DNS, "addresses", len(ips), "polled", MaxAddresses)
		ips = ips[:MaxAddresses]
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, port)
	}
	return out, nil
}

// poll reads one peer's report.
func (e *Exchange) poll(ctx context.Context, addr string) (Report, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Interval)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+Path, nil)
	if err != nil {
		return Report{}, err
	}
	resp, err := e.deps.Client.Do(req)
	if err != nil {
		return Report{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Report{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	return ParseReport(resp.Body)
}

// apply gives the ledger, per worker, the sum over peers heard from within StaleAfter
// (each replica once, however many addresses reached it), and withdraws what it gave
// for workers no fresh peer reports. Peers no longer among addresses are forgotten.
// Called with mu held.
func (e *Exchange) apply(now time.Time, addresses []string) {
	sums := map[string]scoring.Load{}
	counted := map[string]bool{} // replica ids
	live := 0
	for addr, h := range e.heard {
		if !slices.Contains(addresses, addr) {
			delete(e.heard, addr)
			continue
		}
		fresh := now.Sub(h.at) <= e.cfg.StaleAfter
		if fresh != h.live {
			if fresh {
				e.deps.Logger.Info("peers: peer reporting", "peer", addr, "replica", h.report.Replica)
			} else {
				e.deps.Logger.Warn("peers: peer silent; its load is no longer counted", "peer", addr, "replica", h.report.Replica, "silent_for", now.Sub(h.at))
			}
			h.live = fresh
			e.heard[addr] = h
		}
		if !fresh || counted[h.report.Replica] {
			continue
		}
		counted[h.report.Replica] = true
		live++
		for _, w := range h.report.Workers {
			s := sums[w.Worker]
			s.PrefillTokens = addCapped(s.PrefillTokens, w.PrefillTokens)
			s.ActiveRequests = addCapped(s.ActiveRequests, w.ActiveRequests)
			s.PendingRequests = addCapped(s.PendingRequests, w.PendingRequests)
			sums[w.Worker] = s
		}
	}
	for worker := range e.applied {
		if _, ok := sums[worker]; !ok {
			e.deps.Ledger.SetPeerLoad(worker, scoring.Load{})
			delete(e.applied, worker)
		}
	}
	for worker, s := range sums {
		e.deps.Ledger.SetPeerLoad(worker, s)
		e.applied[worker] = true
	}
	e.deps.Metrics.setLive(live)
}

// withdraw forgets every peer load given to the ledger.
func (e *Exchange) withdraw() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for worker := range e.applied {
		e.deps.Ledger.SetPeerLoad(worker, scoring.Load{})
	}
	clear(e.applied)
	e.deps.Metrics.setLive(0)
}

// addCapped adds a peer's count (already at most scoring.MaxPeerCount) to a sum without
// passing scoring.MaxPeerCount, so 64 peers at the bound cannot wrap an int.
func addCapped(sum int, n int64) int {
	return int(min(int64(sum)+n, scoring.MaxPeerCount))
}

// PeerStatus is one polled peer's state, for tests and the log.
type PeerStatus struct {
	Address, Replica string
	LastReport       time.Time
}

// Peers returns the peers heard from, by address.
func (e *Exchange) Peers() []PeerStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]PeerStatus, 0, len(e.heard))
	for addr, h := range e.heard {
		out = append(out, PeerStatus{Address: addr, Replica: h.report.Replica, LastReport: h.at})
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return strings.Compare(a.Address, b.Address) })
	return out
}
