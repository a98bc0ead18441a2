package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/scoring"
)

// Generous deadlines: a loaded CI machine may be slow to schedule the streams.
const (
	waitFor = 20 * time.Second
	pollAt  = 5 * time.Millisecond
)

// fakeLedger records SetPeerLoad as scoring.Bookings keeps it: a zero Load forgets.
type fakeLedger struct {
	mu        sync.Mutex
	peers     map[string]scoring.Load
	adapters  map[string]map[string]int
	histories map[string]float64 // as given, not decayed
	// historySets counts SetPeerHistory calls.
	historySets int
	// now, when set, dates each history given (historiesAt).
	now         func() time.Time
	historiesOn map[string]time.Time
}

// historiesAt is the histories given, each decayed from when it was given to now with
// halfLife, as scoring.Bookings would give them to the cost.
func (l *fakeLedger) historiesAt(now time.Time, halfLife float64) map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]float64{}
	for worker, h := range l.histories {
		out[worker] = h * math.Exp2(-now.Sub(l.historiesOn[worker]).Seconds()/halfLife)
	}
	return out
}

func (l *fakeLedger) SetPeerHistory(worker string, tokens float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.historySets++
	if tokens == 0 {
		delete(l.histories, worker)
		return
	}
	if l.histories == nil {
		l.histories, l.historiesOn = map[string]float64{}, map[string]time.Time{}
	}
	l.histories[worker] = tokens
	if l.now != nil {
		l.historiesOn[worker] = l.now()
	}
}

func (l *fakeLedger) getHistories() map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.histories)
}

func (l *fakeLedger) SetPeerAdapters(worker string, adapters map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(adapters) == 0 {
		delete(l.adapters, worker)
		return
	}
	if l.adapters == nil {
		l.adapters = map[string]map[string]int{}
	}
	l.adapters[worker] = maps.Clone(adapters)
}

func (l *fakeLedger) getAdapters() map[string]map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.adapters)
}

func (l *fakeLedger) SetPeerLoad(worker string, load scoring.Load) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if load == (scoring.Load{}) {
		delete(l.peers, worker)
		return
	}
	l.peers[worker] = load
}

func (l *fakeLedger) get() map[string]scoring.Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.peers)
}

// fakePeer is another replica's admin port serving its report with the real handler.
type fakePeer struct {
	srv    *httptest.Server
	ledger *fakeBookings
}

func newFakePeer(t *testing.T, replica string, loads map[string]scoring.Load) *fakePeer {
	t.Helper()
	p := &fakePeer{ledger: newFakeBookings(loads)}
	p.srv = httptest.NewServer(Handler(replica, p.ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4}))
	t.Cleanup(func() { stopServer(p.srv) })
	return p
}

// stopServer stops a test server whose watch streams are open: httptest's Close alone
// waits for active requests, and a watch stream stays active while its watcher lives.
func stopServer(s *httptest.Server) {
	_ = s.Listener.Close()
	s.CloseClientConnections()
	s.Close()
}

func (p *fakePeer) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// runExchange starts an exchange over cfg (defaults filled in) and stops it at cleanup,
// checking that it withdrew its peer load.
func runExchange(t *testing.T, cfg Config, deps Deps) (*Exchange, *fakeLedger) {
	t.Helper()
	ledger := &fakeLedger{peers: map[string]scoring.Load{}}
	deps.Ledger = ledger
	if deps.Replica == "" {
		deps.Replica = "me"
	}
	def := DefaultConfig()
	cfg.Interval, cfg.StaleAfter, cfg.ResolveInterval = def.Interval, 2*Heartbeat, def.ResolveInterval
	e, err := New(cfg, deps)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		assert.Empty(t, ledger.get(), "a stopped exchange withdraws its peer load")
		assert.Empty(t, ledger.getHistories(), "and its peer prefill history")
	})
	return e, ledger
}

func eventuallyLedger(t *testing.T, ledger *fakeLedger, want map[string]scoring.Load, msg string) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return maps.Equal(ledger.get(), want) }, waitFor, pollAt) {
		t.Fatalf("%s: have %v at the end, want %v", msg, ledger.get(), want)
	}
}

// TestExchangeSumsFreshPeersOnce: the ledger gets, per worker, the sum of the other
// replicas' counts; this replica's own address is skipped, and a replica reached at
// two addresses counts once.
func TestExchangeSumsFreshPeersOnce(t *testing.T) {
	a := newFakePeer(t, "a", map[string]scoring.Load{"w0": {PrefillTokens: 100, ActiveRequests: 2, PendingRequests: 1}})
	b := newFakePeer(t, "b", map[string]scoring.Load{"w0": {PrefillTokens: 50, ActiveRequests: 1, PendingRequests: 1}, "w1": {ActiveRequests: 3}})
	self := newFakePeer(t, "me", map[string]scoring.Load{"w0": {ActiveRequests: 99}})
	_, bPort, err := net.SplitHostPort(b.addr())
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	e, ledger := runExchange(t, Config{Addresses: []string{a.addr(), b.addr(), self.addr(), "localhost:" + bPort}}, Deps{Metrics: NewMetrics(reg)})
	eventuallyLedger(t, ledger, map[string]scoring.Load{
		"w0": {PrefillTokens: 150, ActiveRequests: 3, PendingRequests: 2},
		"w1": {ActiveRequests: 3},
	}, "a and b summed, b once, not this replica")
	require.Eventually(t, func() bool { return len(e.Peers()) == 3 }, waitFor, pollAt, "a, and b at both addresses")
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.live) == 2 }, waitFor, pollAt, "two replicas counted")
	// Its own address answers on a stream of its own, maybe after the others.
	require.Eventually(t, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		_, watched := e.watching[self.addr()]
		return e.self[self.addr()] && !watched
	}, waitFor, pollAt, "its own address is recognised, and no longer watched")
}

// TestExchangeFollowsChangesAndForgetsSilentPeers: each change a peer makes reaches
// the ledger; a worker it no longer reports is withdrawn; a peer that stops (or stops
// sending, connection open) is no longer counted once stale_after passes, and is
// counted again when it comes back.
func TestExchangeFollowsChangesAndForgetsSilentPeers(t *testing.T) {
	a := newFakePeer(t, "a", map[string]scoring.Load{"w0": {ActiveRequests: 2}, "w1": {ActiveRequests: 1}})
	// quiet sends one report on its first watch, then nothing, connection open; the
	// watches after it get no report either (answering each with a report would count
	// it again at every reconnect, gone only for moments the test would have to catch).
	var once sync.Once
	quiet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { _, _ = w.Write(reportLine("q", map[string]scoring.Load{"w9": {ActiveRequests: 7}}, nil)) })
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer stopServer(quiet)
	reg := prometheus.NewRegistry()
	e, ledger := runExchange(t, Config{Addresses: []string{a.addr(), strings.TrimPrefix(quiet.URL, "http://")}}, Deps{Metrics: NewMetrics(reg)})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 2}, "w1": {ActiveRequests: 1}}, "the quiet peer's heartbeat never comes")
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) > 0 }, waitFor, pollAt,
		"the quiet peer's stream is cut (its count may expire a moment before)")

	a.ledger.set(map[string]scoring.Load{"w0": {ActiveRequests: 5, PendingRequests: 1, PrefillTokens: 640}})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 5, PendingRequests: 1, PrefillTokens: 640}}, "the change arrives; w1 went idle")

	addr := a.addr()
	stopServer(a.srv)
	eventuallyLedger(t, ledger, map[string]scoring.Load{}, "a stopped peer stops counting")
	// The gauge is set after the ledger is told, under the exchange's lock that the
	// fake ledger does not hold: the empty ledger may be seen first.
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.live) == 0 }, waitFor, pollAt, "no replica counted")

	// The peer comes back at the same address (a restarted replica: a new id).
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	back := newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 1}})
	srv := &http.Server{Handler: Handler("a2", back, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "back when it answers")
}

// TestExchangeDropsAPeerThatSendsWhatItRefuses: a refused report ends the stream and
// is counted; the last good report counts until it is stale.
func TestExchangeDropsAPeerThatSendsWhatItRefuses(t *testing.T) {
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(reportLine("bad", map[string]scoring.Load{"w0": {ActiveRequests: 1}}, nil))
		_, _ = fmt.Fprintln(w, `{"version":1,"replica":"bad","workers":[{"worker":"w0","active_requests":-1}]}`)
	}))
	defer stopServer(bad)
	reg := prometheus.NewRegistry()
	e, ledger := runExchange(t, Config{Addresses: []string{strings.TrimPrefix(bad.URL, "http://")}}, Deps{Metrics: NewMetrics(reg)})
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("refused")) >= 2 }, waitFor, pollAt)
	assert.Positive(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))
	for _, l := range ledger.get() {
		assert.Equal(t, 1, l.ActiveRequests, "a refused count never reaches the ledger")
	}
}

// TestExchangeTakesACutLineForACutStream: a stream cut inside a report (the peer's
// write timed out under CPU starvation, or it died) ends as a disconnect, not as a
// refused report: the part of a line before the cut is not the peer's report.
func TestExchangeTakesACutLineForACutStream(t *testing.T) {
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := reportLine("cut", map[string]scoring.Load{"w0": {ActiveRequests: 1}}, nil)
		_, _ = w.Write(line)
		_, _ = w.Write(line[:len(line)/2])
	}))
	defer stopServer(cut)
	reg := prometheus.NewRegistry()
	e, ledger := runExchange(t, Config{Addresses: []string{strings.TrimPrefix(cut.URL, "http://")}}, Deps{Metrics: NewMetrics(reg)})
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 2 }, waitFor, pollAt, "the cut stream is dropped and watched again")
	assert.Positive(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))
	assert.Zero(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("refused")), "a cut line counted as a refused report")
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "the whole report counts")
}

// TestExchangeSumsStayBounded: many peers at the count bound do not wrap the sum.
func TestExchangeSumsStayBounded(t *testing.T) {
	var addrs []string
	for _, id := range []string{"a", "b", "c"} {
		addrs = append(addrs, newFakePeer(t, id, map[string]scoring.Load{"w": {PrefillTokens: scoring.MaxPeerCount, ActiveRequests: scoring.MaxPeerCount}}).addr())
	}
	_, ledger := runExchange(t, Config{Addresses: addrs}, Deps{})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w": {PrefillTokens: scoring.MaxPeerCount, ActiveRequests: scoring.MaxPeerCount}}, "capped")
}

type fakeResolver struct {
	mu      sync.Mutex
	answers [][]string // one per lookup, the last repeated; an empty answer is a failure
	lookups int
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if host != "replicas.test" {
		return nil, errors.New("unexpected host " + host)
	}
	answer := r.answers[min(r.lookups, len(r.answers)-1)]
	r.lookups++
	if len(answer) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host}
	}
	return answer, nil
}

func (r *fakeResolver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups
}

// TestExchangeFindsPeersByDNS: every address of the DNS name is watched at the
// configured port, the name is looked up again every resolve_interval, a failed lookup
// keeps the last addresses, and a peer gone from the answer is forgotten.
func TestExchangeFindsPeersByDNS(t *testing.T) {
	a := newFakePeer(t, "a", map[string]scoring.Load{"w0": {ActiveRequests: 1}})
	_, port, err := net.SplitHostPort(a.addr())
	require.NoError(t, err)
	resolver := &fakeResolver{answers: [][]string{{"127.0.0.1"}, {}, {"127.0.0.2"}}}
	c := &clock{now: time.Unix(1000, 0)}
	e, ledger := runExchange(t, Config{DNS: "replicas.test:" + port}, Deps{Resolver: resolver, Now: c.Now})

	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "the answer's address is watched")
	assert.Equal(t, 1, resolver.count(), "not looked up again before resolve_interval")

	c.advance(e.cfg.ResolveInterval)
	lookedUp := func(n int) func() bool {
		return func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return resolver.count() == n && !e.resolving
		}
	}
	require.Eventually(t, lookedUp(2), waitFor, pollAt, "the failed lookup ended")
	e.mu.Lock()
	assert.Equal(t, []string{"127.0.0.1:" + port}, e.resolved, "a failed lookup keeps the last addresses")
	e.mu.Unlock()
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "still watched")

	c.advance(e.cfg.ResolveInterval)
	require.Eventually(t, func() bool { return resolver.count() == 3 }, waitFor, pollAt)
	eventuallyLedger(t, ledger, map[string]scoring.Load{}, "a peer gone from the answer is forgotten")
}

func TestNewRefusesBadConfigByKey(t *testing.T) {
	def := DefaultConfig()
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{"address without a port", func(c *Config) { c.Addresses = []string{"10.0.0.1"} }, "peers.addresses[0]: must be host:port"},
		{"dns without a port", func(c *Config) { c.DNS = "kvroute-peers" }, "peers.dns: must be host:port"},
		{"interval too short", func(c *Config) { c.Interval = time.Microsecond }, "peers.interval"},
		{"interval past the heartbeat", func(c *Config) { c.Interval = time.Second }, "peers.interval"},
		{"stale within two heartbeats", func(c *Config) { c.StaleAfter = Heartbeat }, "peers.stale_after"},
		{"resolve too often", func(c *Config) { c.ResolveInterval = 10 * time.Millisecond }, "peers.resolve_interval"},
		{"too many addresses", func(c *Config) { c.Addresses = make([]string, MaxAddresses+1) }, "peers.addresses: at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := def
			tt.edit(&cfg)
			_, err := New(cfg, Deps{Ledger: &fakeLedger{}, Replica: "me"})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
	_, err := New(def, Deps{Replica: "me"})
	assert.Error(t, err, "a ledger is required")
}

func TestConfigAcceptsNamesAndIPLiterals(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{"port out of range", func(c *Config) { c.Addresses = []string{"10.0.0.1:99999"} }, "peers.addresses[0]: port must be"},
		{"port zero", func(c *Config) { c.Addresses = []string{"10.0.0.1:0"} }, "peers.addresses[0]: port must be"},
		{"named port", func(c *Config) { c.Addresses = []string{"kvroute-0:admin"} }, "peers.addresses[0]: port must be"},
		{"a path in the host", func(c *Config) { c.Addresses = []string{"kvroute-0/admin:9090"} }, "peers.addresses[0]: host"},
		{"user info in the host", func(c *Config) { c.Addresses = []string{"user@kvroute-0:9090"} }, "peers.addresses[0]: host"},
		{"a query after the port", func(c *Config) { c.DNS = "kvroute-peers:9090?x" }, "peers.dns: port must be"},
		{"dns host with a path", func(c *Config) { c.DNS = "kvroute-peers/x:9090" }, "peers.dns: host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.edit(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
	ok := DefaultConfig()
	ok.Addresses = []string{"kvroute-0.kvroute:9090", "10.0.0.1:9090", "[fd00::1]:9090", "[fe80::1%eth0]:9090"}
	ok.DNS = "kvroute-peers.default.svc:9090"
	assert.NoError(t, ok.Validate(), "names, IPv4 and IPv6 literals (with a zone) are watched")
}

// TestWatchReachesTheAddressAsWritten: a watch goes to host:port at Path, IPv6 literals
// (and their zones, which a DNS answer may carry) included.
func TestWatchReachesTheAddressAsWritten(t *testing.T) {
	for _, addr := range []string{"kvroute-0:9090", "[fd00::1]:9090", "[fe80::1%eth0]:9090"} {
		req, err := http.NewRequest(http.MethodGet, watchURL("http", addr), nil)
		require.NoError(t, err, addr)
		assert.Equal(t, addr, req.URL.Host)
		assert.Equal(t, Path, req.URL.Path)
		assert.True(t, req.URL.Query().Has("watch"))
	}
}

// TestRunClosesItsConnectionsWhenItStops: the connections to the peers are the
// exchange's own, and closed when Run returns, not left to a shared transport.
func TestRunClosesItsConnectionsWhenItStops(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 1}})
	srv := httptest.NewUnstartedServer(Handler("a", ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4}))
	var mu sync.Mutex
	open := 0
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open++
		case http.StateClosed, http.StateHijacked:
			open--
		}
	}
	srv.Start()
	defer stopServer(srv)
	into := &fakeLedger{peers: map[string]scoring.Load{}}
	e, err := New(DefaultConfig(), Deps{Ledger: into, Replica: "me"})
	require.NoError(t, err)
	e.cfg.Addresses = []string{strings.TrimPrefix(srv.URL, "http://")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return len(into.get()) == 1 }, waitFor, pollAt)
	cancel()
	<-done
	assert.Empty(t, into.get())
	assert.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return open == 0 }, waitFor, pollAt,
		"no connection to the peer is left open once Run has returned")
}

// TestExchangeRefusesHugeResponseHeaders: a peer cannot make a watch read megabytes of
// headers; its stream is dropped like a failed one.
func TestExchangeRefusesHugeResponseHeaders(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Padding", strings.Repeat("x", 1<<20))
		_, _ = w.Write(reportLine("a", map[string]scoring.Load{"w0": {ActiveRequests: 1}}, nil))
	}))
	defer stopServer(huge)
	reg := prometheus.NewRegistry()
	e, ledger := runExchange(t, Config{Addresses: []string{strings.TrimPrefix(huge.URL, "http://")}}, Deps{Metrics: NewMetrics(reg)})
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 1 }, waitFor, pollAt)
	assert.Empty(t, ledger.get(), "a report behind a 1 MiB header is refused")
	assert.Zero(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))
}

// hangingResolver answers only when released, or fails when its context ends.
type hangingResolver struct {
	release chan struct{}
	answer  []string
	mu      sync.Mutex
	lookups int
	ended   int // lookups that have returned
}

func (r *hangingResolver) LookupHost(ctx context.Context, _ string) ([]string, error) {
	r.mu.Lock()
	r.lookups++
	r.mu.Unlock()
	defer func() { r.mu.Lock(); r.ended++; r.mu.Unlock() }()
	select {
	case <-r.release:
		return r.answer, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *hangingResolver) counts() (lookups, ended int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups, r.ended
}

// TestSlowDNSDoesNotHoldTheWatches: while a DNS lookup hangs the static peers are
// watched (and one lookup runs at a time), the answer's peers join when it comes, and
// Run returns while a lookup hangs, once the lookup has ended.
func TestSlowDNSDoesNotHoldTheWatches(t *testing.T) {
	a := newFakePeer(t, "a", map[string]scoring.Load{"w0": {ActiveRequests: 1}})
	b := newFakePeer(t, "b", map[string]scoring.Load{"w1": {ActiveRequests: 2}})
	host, port, err := net.SplitHostPort(b.addr())
	require.NoError(t, err)
	resolver := &hangingResolver{release: make(chan struct{}), answer: []string{host}}
	_, ledger := runExchange(t, Config{Addresses: []string{a.addr()}, DNS: "replicas.test:" + port}, Deps{Resolver: resolver})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "the static peer is counted while the lookup hangs")
	lookups, _ := resolver.counts()
	assert.Equal(t, 1, lookups, "one lookup at a time")
	close(resolver.release)
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}, "w1": {ActiveRequests: 2}}, "the answer's peer joins")

	hung := &hangingResolver{release: make(chan struct{})}
	ledger2 := &fakeLedger{peers: map[string]scoring.Load{}}
	cfg := DefaultConfig()
	cfg.Addresses, cfg.DNS = []string{a.addr()}, "replicas.test:"+port
	e, err := New(cfg, Deps{Ledger: ledger2, Replica: "me", Resolver: hung})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	eventuallyLedger(t, ledger2, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "watching meanwhile")
	cancel()
	<-done
	lookups, ended := hung.counts()
	assert.Equal(t, 1, lookups)
	assert.Equal(t, 1, ended, "Run returned after the lookup it started")
}

// TestReplicaAtTwoAddressesCountsItsLatestReport: when one of a replica's two
// addresses goes silent, the older report it last gave there is not summed in place of
// the replica's current one, whichever address the sum visits first.
func TestReplicaAtTwoAddressesCountsItsLatestReport(t *testing.T) {
	b := newFakePeer(t, "b", map[string]scoring.Load{"w0": {ActiveRequests: 4}})
	// b's second address: a front that sends b's first report, then nothing, and
	// refuses the watches after the first.
	first := reportLine("b", map[string]scoring.Load{"w0": {ActiveRequests: 4}}, nil)
	var once sync.Once
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered := false
		once.Do(func() { answered = true })
		if !answered {
			http.Error(w, "gone", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(first)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer stopServer(front)
	c := &clock{now: time.Unix(1000, 0)}
	e, ledger := runExchange(t, Config{Addresses: []string{b.addr(), strings.TrimPrefix(front.URL, "http://")}}, Deps{Now: c.Now})
	require.Eventually(t, func() bool { return len(e.Peers()) == 2 }, waitFor, pollAt, "b heard at both addresses")
	c.advance(time.Millisecond) // b's next report is newer than the front's
	b.ledger.set(map[string]scoring.Load{"w0": {ActiveRequests: 1}})
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, "b's latest report")
	for i := range 20 { // which address a map visits first is random
		e.mu.Lock()
		e.expire(c.Now())
		e.mu.Unlock()
		require.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, ledger.get(), "sum %d", i)
	}
}

// TestBackoffGrowsUnlessTheStreamWasHealthy: a stream that delivered reports for a
// while is reopened soon; one that failed, ended early (a peer ending every stream
// after one report), or ended on a refused report (whatever it sent before), waits
// twice as long each time, up to the cap.
func TestBackoffGrowsUnlessTheStreamWasHealthy(t *testing.T) {
	refused := fmt.Errorf("%w: %w", errRefused, errors.New("report: version 2, want 1"))
	for _, tt := range []struct {
		name    string
		last    time.Duration
		healthy bool
		err     error
		want    time.Duration
	}{
		{"the first failure", 0, false, errors.New("connection refused"), minBackoff},
		{"failing again doubles", 400 * time.Millisecond, false, errors.New("connection refused"), 800 * time.Millisecond},
		{"up to the cap", maxBackoff, false, errors.New("status 503"), maxBackoff},
		{"a healthy stream, then its end", maxBackoff, true, errStreamEnded, minBackoff},
		{"a stream ended early, cleanly", 400 * time.Millisecond, false, errStreamEnded, 800 * time.Millisecond},
		{"a healthy stream, then a refused report", 400 * time.Millisecond, true, refused, 800 * time.Millisecond},
		{"a refused report first", 0, false, refused, minBackoff},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, backoffAfter(tt.last, tt.healthy, tt.err))
		})
	}
}

// TestPeersWithATokenCountOnlyPeersBearingIt: a replica with peers.token_file serves
// its report only to requests bearing the secret; a peer with the same secret counts
// its load, one with another is refused, counted as a disconnect each time, and warned
// of once, not at each retry.
func TestPeersWithATokenCountOnlyPeersBearingIt(t *testing.T) {
	const secret = "0123456789abcdef-peers"
	guarded := &fakePeer{ledger: newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 2}})}
	guarded.srv = httptest.NewServer(Handler("g", guarded.ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4, Token: secret}))
	t.Cleanup(func() { stopServer(guarded.srv) })

	t.Run("the same secret", func(t *testing.T) {
		_, ledger := runExchange(t, Config{Addresses: []string{guarded.addr()}}, Deps{Token: secret})
		eventuallyLedger(t, ledger, map[string]scoring.Load{"w0": {ActiveRequests: 2}}, "counted")
	})
	t.Run("another secret", func(t *testing.T) {
		logs := &logbuf.Buffer{}
		reg := prometheus.NewRegistry()
		e, ledger := runExchange(t, Config{Addresses: []string{guarded.addr()}}, Deps{Token: "another-secret-of-16", Metrics: NewMetrics(reg),
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 3 }, waitFor, pollAt, "refused, and retried")
		assert.Empty(t, ledger.get(), "nothing counted")
		assert.Equal(t, 1, strings.Count(logs.String(), "refuses this replica's token"), "warned once: %s", logs.String())
		assert.NotContains(t, logs.String(), "another-secret", "the secret is never logged")
	})
}

// TestStreamsAreRenewedWithoutLosingThePeer: a replica ends every watch stream after
// MaxStreamAge (so a watcher that stopped reading cannot hold its slot); the watcher
// opens a new one within minBackoff, never lets the peer go silent (stale_after is
// 500 ms here), and does not call it a disconnect.
func TestStreamsAreRenewedWithoutLosingThePeer(t *testing.T) {
	ledger := newFakeBookings(map[string]scoring.Load{"w0": {ActiveRequests: 3}})
	var mu sync.Mutex
	opened := 0
	// Past healthyStream, as the minute of a real stream is: a renewal, not a peer
	// ending streams early.
	handler := Handler("p", ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 4, MaxStreamAge: healthyStream + 100*time.Millisecond})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		opened++
		mu.Unlock()
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { stopServer(srv) })
	reg := prometheus.NewRegistry()
	logs := &logbuf.Buffer{}
	e, into := runExchange(t, Config{Addresses: []string{strings.TrimPrefix(srv.URL, "http://")}},
		Deps{Metrics: NewMetrics(reg), Logger: slog.New(slog.NewTextHandler(logs, nil))})
	// Four renewals: a back-off that kept doubling would wait 800 ms before the fifth
	// stream, past stale_after.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return opened >= 5 }, waitFor, pollAt, "streams end and are reopened")
	eventuallyLedger(t, into, map[string]scoring.Load{"w0": {ActiveRequests: 3}}, "the peer still counts")
	assert.Zero(t, testutil.ToFloat64(e.deps.Metrics.disconnects), "a renewal is not a disconnect")
	assert.NotContains(t, logs.String(), "peer silent", "the peer never went silent between streams")
}

// TestConfigSaysWhereThePeersAreAndWhetherATokenGuards: what `extproc validate` prints.
func TestConfigSaysWhereThePeersAreAndWhetherATokenGuards(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"nothing", Config{Interval: 10 * time.Millisecond}, "no peers"},
		{"a token alone", Config{TokenFile: "/t"}, "no peers, own report guarded by a token from /t"},
		{"addresses", Config{Addresses: []string{"a:1", "b:1"}, Interval: 10 * time.Millisecond, ShareBlocks: true}, "peers from 2 addresses, changes sent within 10ms, decisions' blocks shared, no token, plain HTTP"},
		{"DNS and a token", Config{DNS: "kvroute:9090", Interval: 5 * time.Millisecond, TokenFile: "/t"}, "peers from DNS kvroute:9090, changes sent within 5ms, decisions' blocks not shared, token from /t, plain HTTP"},
		{"over TLS", Config{DNS: "kvroute:9090", Interval: 5 * time.Millisecond, TLS: TLSConfig{CAFile: "/ca"}}, "peers from DNS kvroute:9090, changes sent within 5ms, decisions' blocks not shared, no token, over TLS"},
		{"over mTLS", Config{DNS: "kvroute:9090", Interval: 5 * time.Millisecond, TLS: TLSConfig{CertFile: "/c", KeyFile: "/k"}}, "peers from DNS kvroute:9090, changes sent within 5ms, decisions' blocks not shared, no token, over TLS with a client certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.cfg.String()) })
	}
}

// TestExchangeSumsThePeersResidentAdapters: two peers' resident LoRA adapters reach the
// ledger summed per worker (an adapter resident on both counts both replicas'
// requests); an adapter a peer stops reporting leaves, and a stopped exchange withdraws
// them all.
func TestExchangeSumsThePeersResidentAdapters(t *testing.T) {
	a := newFakePeer(t, "a", map[string]scoring.Load{"w0": {ActiveRequests: 2}})
	a.ledger.setAdapters(map[string]map[string]int{"w0": {"sql": 2}})
	b := newFakePeer(t, "b", map[string]scoring.Load{"w0": {ActiveRequests: 1}, "w1": {}})
	b.ledger.setAdapters(map[string]map[string]int{"w0": {"sql": 1}, "w1": {"chat": 0}})
	e, ledger := runExchange(t, Config{Addresses: []string{a.addr(), b.addr()}}, Deps{})
	eventually := func(want map[string]map[string]int, msg string) {
		t.Helper()
		if !assert.Eventually(t, func() bool { return reflect.DeepEqual(ledger.getAdapters(), want) }, waitFor, pollAt) {
			t.Fatalf("%s: have %v, want %v", msg, ledger.getAdapters(), want)
		}
	}
	eventually(map[string]map[string]int{"w0": {"sql": 3}, "w1": {"chat": 0}}, "both peers' adapters, summed; chat resident between requests")
	b.ledger.setAdapters(map[string]map[string]int{"w0": {"sql": 1}})
	eventually(map[string]map[string]int{"w0": {"sql": 3}}, "chat is no longer resident on w1")
	e.withdraw()
	eventually(map[string]map[string]int{}, "withdrawn with the peer load")
}
