package peers

import (
	"bufio"
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

// Reconnection back-off after a watch stream fails: from minBackoff, doubling, at most
// maxBackoff.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// PeerLedger is where the peers' summed counts go: scoring.Bookings.
type PeerLedger interface {
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
	Ledger PeerLedger
	// Replica is this process's id, as its [Handler] serves it.
	Replica string
	// Client watches the peers; nil uses the exchange's own (see newClient), whose
	// connections are closed when Run returns.
	Client *http.Client
	// Resolver looks up Config.DNS; nil uses net.DefaultResolver.
	Resolver Resolver
	// Now is the clock for staleness and DNS refreshes; nil uses time.Now.
	Now     func() time.Time
	Metrics *Metrics
	Logger  *slog.Logger
}

// Exchange watches every peer's report stream and keeps the ledger's peer load at the
// sum of the fresh ones.
type Exchange struct {
	cfg  Config
	deps Deps

	mu         sync.Mutex
	heard      map[string]heard              // by address: the last report a peer sent
	self       map[string]bool               // addresses that answered with this replica's id
	watching   map[string]context.CancelFunc // by address: its watch goroutine
	resolved   []string                      // the DNS name's addresses at the last lookup
	resolvedAt time.Time                     // when the last lookup ended
	resolving  bool                          // a lookup is under way
	applied    map[string]scoring.Load       // per worker, the peer load the ledger holds

	watchers  sync.WaitGroup  // the watch goroutines
	lookups   sync.WaitGroup  // the DNS lookup under way
	transport *http.Transport // the default client's, closed by Run; nil with Deps.Client
}

// heard is a peer's last accepted report and when it came.
type heard struct {
	report Report
	at     time.Time
	live   bool // counted in the last sum (to log the changes only)
}

// New returns the exchange for cfg; call [Exchange.Run] to watch the peers.
func New(cfg Config, deps Deps) (*Exchange, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Ledger == nil || deps.Replica == "" {
		return nil, errors.New("peers: Ledger and Replica are required")
	}
	var transport *http.Transport
	if deps.Client == nil {
		deps.Client, transport = newClient()
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
	return &Exchange{cfg: cfg, deps: deps, heard: map[string]heard{}, self: map[string]bool{},
		watching: map[string]context.CancelFunc{}, applied: map[string]scoring.Load{}, transport: transport}, nil
}

// maxHeaderBytes bounds a peer's response headers; a replica sends three short ones.
const maxHeaderBytes = 64 << 10

// newClient returns the client peers are watched with: a transport of its own (not
// http.DefaultTransport, whose idle connections would outlive Run and which reads
// 10 MiB of headers), one idle connection per peer, no proxy (peers are other
// replicas' admin ports on the same network; HTTP_PROXY is for egress), and no
// redirects (a report is at the address asked).
func newClient() (*http.Client, *http.Transport) {
	t := &http.Transport{
		DialContext:            (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:           2 * MaxAddresses,
		MaxIdleConnsPerHost:    1,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, t
}

// Run watches the peers until ctx ends: every [Heartbeat] it refreshes the peer set
// and drops the peers silent past Config.StaleAfter. When it returns, every watch and
// lookup has ended, the connections to the peers are closed, and the peer load given
// to the ledger is withdrawn.
func (e *Exchange) Run(ctx context.Context) {
	tick := time.NewTicker(Heartbeat)
	defer tick.Stop()
	for {
		e.maintain(ctx)
		select {
		case <-ctx.Done():
			e.mu.Lock()
			for _, stop := range e.watching {
				stop()
			}
			e.mu.Unlock()
			e.watchers.Wait()
			e.lookups.Wait() // its context is ctx: it is ending
			if e.transport != nil {
				e.transport.CloseIdleConnections() // every watch has ended: all are idle
			}
			e.withdraw()
			return
		case <-tick.C:
		}
	}
}

// maintain starts a watch for each new peer address, stops those of addresses gone,
// and sums again (a peer may have gone stale).
func (e *Exchange) maintain(ctx context.Context) {
	addresses := e.addresses(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	for addr, stop := range e.watching {
		if !slices.Contains(addresses, addr) {
			stop()
			delete(e.watching, addr)
			delete(e.heard, addr)
		}
	}
	if ctx.Err() == nil {
		for _, addr := range addresses {
			if _, ok := e.watching[addr]; !ok {
				watchCtx, stop := context.WithCancel(ctx)
				e.watching[addr] = stop
				e.watchers.Go(func() { e.watch(watchCtx, addr) })
			}
		}
	}
	e.apply(e.deps.Now())
}

// addresses returns the peers to watch: the static list and the DNS name's addresses
// at the last lookup, without this replica's own. When a lookup is due (every
// Config.ResolveInterval) it starts one that it does not wait for: a slow DNS server
// must not hold the maintenance that drops silent peers. A failed lookup keeps the
// last answer.
func (e *Exchange) addresses(ctx context.Context) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.DNS != "" && !e.resolving && ctx.Err() == nil &&
		(e.resolvedAt.IsZero() || e.deps.Now().Sub(e.resolvedAt) >= e.cfg.ResolveInterval) {
		e.resolving = true
		e.lookups.Go(func() { e.lookUp(ctx) })
	}
	var out []string
	for _, a := range slices.Concat(e.cfg.Addresses, e.resolved) {
		if !e.self[a] && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// lookUp resolves the DNS name and keeps the answer for the next maintenance.
func (e *Exchange) lookUp(ctx context.Context) {
	resolved, err := e.resolve(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resolving, e.resolvedAt = false, e.deps.Now()
	if err != nil {
		e.deps.Logger.Warn("peers: DNS lookup failed; watching the addresses last found", "dns", e.cfg.DNS, "err", err)
		return
	}
	e.resolved = resolved
}

func (e *Exchange) resolve(ctx context.Context) ([]string, error) {
	host, port, _ := net.SplitHostPort(e.cfg.DNS)                  // validated
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ResolveInterval) // the next lookup is due by then
	defer cancel()
	ips, err := e.deps.Resolver.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	slices.Sort(ips)
	if len(ips) > MaxAddresses {
		e.deps.Logger.Warn("peers: DNS answer has more addresses than are watched", "dns", e.cfg.DNS, "addresses", len(ips), "watched", MaxAddresses)
		ips = ips[:MaxAddresses]
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, port)
	}
	return out, nil
}

// errSelf ends the watch of this replica's own address.
var errSelf = errors.New("this replica's own address")

// watch follows one peer's report stream until ctx ends, reconnecting with back-off
// when the stream fails; it ends for good at this replica's own address.
func (e *Exchange) watch(ctx context.Context, addr string) {
	backoff := minBackoff
	for {
		got, err := e.stream(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSelf) {
			e.mu.Lock()
			e.self[addr] = true
			delete(e.watching, addr)
			e.mu.Unlock()
			return
		}
		e.deps.Metrics.disconnected()
		e.deps.Logger.Debug("peers: watch ended", "peer", addr, "err", err)
		if got {
			backoff = minBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// stream reads one watch stream of a peer, applying each report as it comes. A peer
// silent for StaleAfter (no report, not even a heartbeat) is cut off, as is one that
// sends a report this replica refuses. got says whether any report was accepted.
func (e *Exchange) stream(ctx context.Context, addr string) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	silence := time.AfterFunc(e.cfg.StaleAfter, cancel)
	defer silence.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, watchURL(addr), nil)
	if err != nil {
		return false, err
	}
	resp, err := e.deps.Client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4096), MaxReportBytes+1)
	for lines.Scan() {
		silence.Reset(e.cfg.StaleAfter)
		r, err := parseReport(lines.Bytes())
		if err != nil {
			e.deps.Metrics.reported(false)
			return got, err
		}
		if r.Replica == e.deps.Replica {
			return got, errSelf
		}
		e.deps.Metrics.reported(true)
		got = true
		e.mu.Lock()
		if _, ok := e.watching[addr]; ok { // not a watch maintain has just stopped
			e.heard[addr] = heard{report: r, at: e.deps.Now(), live: e.heard[addr].live}
			e.apply(e.deps.Now())
		}
		e.mu.Unlock()
	}
	if err := lines.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			e.deps.Metrics.reported(false)
		}
		return got, err
	}
	return got, errors.New("stream ended")
}

// apply gives the ledger, per worker, the sum over the peers heard from within
// StaleAfter (each replica once, however many addresses reached it: its latest report),
// telling it only what changed, and withdraws what it gave for workers no fresh peer
// reports. Called with mu held.
func (e *Exchange) apply(now time.Time) {
	newest := map[string]string{} // replica id → the address of its newest fresh report
	for addr, h := range e.heard {
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
		if !fresh {
			continue
		}
		// A replica reached at two addresses counts once, with the later of its reports
		// (the other address may have gone silent, holding an older one).
		if b, ok := newest[h.report.Replica]; !ok || h.at.After(e.heard[b].at) || h.at.Equal(e.heard[b].at) && addr < b {
			newest[h.report.Replica] = addr
		}
	}
	sums := map[string]scoring.Load{}
	for _, addr := range newest {
		for _, w := range e.heard[addr].report.Workers {
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
		if e.applied[worker] != s {
			e.deps.Ledger.SetPeerLoad(worker, s)
			e.applied[worker] = s
		}
	}
	e.deps.Metrics.setLive(len(newest))
}

// withdraw forgets every peer load given to the ledger.
func (e *Exchange) withdraw() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for worker := range e.applied {
		e.deps.Ledger.SetPeerLoad(worker, scoring.Load{})
	}
	clear(e.applied)
	clear(e.heard)
	e.deps.Metrics.setLive(0)
}

// addCapped adds a peer's count (already at most scoring.MaxPeerCount) to a sum without
// passing scoring.MaxPeerCount, so peers at the bound (up to 2 × MaxAddresses: the
// list and a DNS answer) cannot wrap an int.
func addCapped(sum int, n int64) int {
	return int(min(int64(sum)+n, scoring.MaxPeerCount))
}

// PeerStatus is one watched peer's state.
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
