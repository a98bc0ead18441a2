package peers

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// fakeLedger records SetPeerLoad as scoring.Bookings keeps it: a zero Load forgets.
type fakeLedger struct {
	mu    sync.Mutex
	peers map[string]scoring.Load
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
	out := map[string]scoring.Load{}
	for k, v := range l.peers {
		out[k] = v
	}
	return out
}

// fakePeer is another replica's admin port serving a report it can change.
type fakePeer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	body string
}

func newFakePeer(t *testing.T, replica string, workers ...WorkerLoad) *fakePeer {
	p := &fakePeer{}
	p.set(replica, workers...)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		_, _ = w.Write([]byte(p.body))
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePeer) set(replica string, workers ...WorkerLoad) {
	raw, _ := json.Marshal(Report{Version: Version, Replica: replica, Workers: workers})
	p.setRaw(string(raw))
}

func (p *fakePeer) setRaw(body string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.body = body
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

func newExchange(t *testing.T, cfg Config, deps Deps) (*Exchange, *fakeLedger, *clock) {
	t.Helper()
	ledger := &fakeLedger{peers: map[string]scoring.Load{}}
	c := &clock{now: time.Unix(1000, 0)}
	deps.Ledger, deps.Now = ledger, c.Now
	if deps.Replica == "" {
		deps.Replica = "me"
	}
	if cfg.Interval == 0 {
		def := DefaultConfig()
		cfg.Interval, cfg.StaleAfter, cfg.ResolveInterval = time.Second, def.StaleAfter*3, def.ResolveInterval // a loaded CI machine may be slow to answer
	}
	e, err := New(cfg, deps)
	require.NoError(t, err)
	return e, ledger, c
}

// TestExchangeSumsFreshPeersOnce: the ledger gets, per worker, the sum of the other
// replicas' counts; this replica's own address is skipped, and a replica reached at
// two addresses counts once.
func TestExchangeSumsFreshPeersOnce(t *testing.T) {
	a := newFakePeer(t, "a", WorkerLoad{Worker: "w0", PrefillTokens: 100, ActiveRequests: 2, PendingRequests: 1})
	b := newFakePeer(t, "b", WorkerLoad{Worker: "w0", PrefillTokens: 50, ActiveRequests: 1, PendingRequests: 1},
		WorkerLoad{Worker: "w1", ActiveRequests: 3})
	self := newFakePeer(t, "me", WorkerLoad{Worker: "w0", ActiveRequests: 99})
	// b again under another address: the loopback name.
	bAgain := "localhost:" + b.addr()[strings.LastIndex(b.addr(), ":")+1:]
	reg := prometheus.NewRegistry()
	e, ledger, _ := newExchange(t, Config{Addresses: []string{a.addr(), b.addr(), self.addr(), bAgain}}, Deps{Metrics: NewMetrics(reg)})
	e.round(context.Background())
	assert.Equal(t, map[string]scoring.Load{
		"w0": {PrefillTokens: 150, ActiveRequests: 3, PendingRequests: 2},
		"w1": {ActiveRequests: 3},
	}, ledger.get())
	assert.Equal(t, 2.0, testutil.ToFloat64(e.deps.Metrics.live), "two replicas counted")
	assert.Len(t, e.Peers(), 3, "a and b at both addresses; not this replica's own")
	assert.Equal(t, 4.0, testutil.ToFloat64(e.deps.Metrics.polls.WithLabelValues("ok")))

	e.round(context.Background())
	assert.Equal(t, 7.0, testutil.ToFloat64(e.deps.Metrics.polls.WithLabelValues("ok")), "its own address is not polled again")
}

// TestExchangeForgetsWhatPeersNoLongerReport: counts follow the latest reports; a
// worker a peer stops reporting and a peer silent past stale_after leave the ledger,
// and a peer that answers again is counted again.
func TestExchangeForgetsWhatPeersNoLongerReport(t *testing.T) {
	a := newFakePeer(t, "a", WorkerLoad{Worker: "w0", ActiveRequests: 2}, WorkerLoad{Worker: "w1", ActiveRequests: 1})
	e, ledger, c := newExchange(t, Config{Addresses: []string{a.addr()}}, Deps{})
	ctx := context.Background()
	e.round(ctx)
	require.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 2}, "w1": {ActiveRequests: 1}}, ledger.get())

	a.set("a", WorkerLoad{Worker: "w0", ActiveRequests: 5})
	e.round(ctx)
	assert.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 5}}, ledger.get(), "w1 went idle on the peer")

	a.setRaw(`{"version":1,"replica":"a","workers":[{"worker":"w0","active_requests":-4}]}`)
	e.round(ctx)
	assert.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 5}}, ledger.get(), "a refused report keeps the last one while it is fresh")
	c.advance(e.cfg.StaleAfter + time.Millisecond)
	e.round(ctx)
	assert.Empty(t, ledger.get(), "a peer silent past stale_after is no longer counted")

	a.set("a", WorkerLoad{Worker: "w0", ActiveRequests: 1})
	e.round(ctx)
	assert.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, ledger.get(), "back when it answers")
}

// TestExchangeSumsStayBounded: many peers at the count bound do not wrap the sum.
func TestExchangeSumsStayBounded(t *testing.T) {
	var addrs []string
	for _, id := range []string{"a", "b", "c"} {
		addrs = append(addrs, newFakePeer(t, id, WorkerLoad{Worker: "w", PrefillTokens: scoring.MaxPeerCount, ActiveRequests: scoring.MaxPeerCount}).addr())
	}
	e, ledger, _ := newExchange(t, Config{Addresses: addrs}, Deps{})
	e.round(context.Background())
	assert.Equal(t, scoring.Load{PrefillTokens: scoring.MaxPeerCount, ActiveRequests: scoring.MaxPeerCount}, ledger.get()["w"])
}

type fakeResolver struct {
	mu      sync.Mutex
	answers [][]string // one per lookup; an empty answer is a failure
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

// TestExchangeFindsPeersByDNS: every address of the DNS name is polled at the
// configured port, the name is looked up again every resolve_interval, and a failed
// lookup keeps polling the last addresses found.
func TestExchangeFindsPeersByDNS(t *testing.T) {
	a := newFakePeer(t, "a", WorkerLoad{Worker: "w0", ActiveRequests: 1})
	_, port, err := net.SplitHostPort(a.addr())
	require.NoError(t, err)
	resolver := &fakeResolver{answers: [][]string{{"127.0.0.1"}, {}, {"127.0.0.2"}}}
	e, ledger, c := newExchange(t, Config{DNS: "replicas.test:" + port}, Deps{Resolver: resolver})
	ctx := context.Background()

	e.round(ctx)
	assert.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, ledger.get())
	e.round(ctx)
	assert.Equal(t, 1, resolver.lookups, "not looked up again before resolve_interval")

	c.advance(e.cfg.ResolveInterval)
	e.round(ctx)
	assert.Equal(t, 2, resolver.lookups)
	assert.Equal(t, map[string]scoring.Load{"w0": {ActiveRequests: 1}}, ledger.get(), "a failed lookup keeps the last addresses")

	c.advance(e.cfg.ResolveInterval)
	e.round(ctx)
	assert.Equal(t, 3, resolver.lookups)
	assert.Empty(t, ledger.get(), "a peer gone from the answer is forgotten at once")
	assert.Empty(t, e.Peers())
}

// TestRunWithdrawsPeerLoadWhenItStops: a stopped exchange leaves no peer load behind.
func TestRunWithdrawsPeerLoadWhenItStops(t *testing.T) {
	a := newFakePeer(t, "a", WorkerLoad{Worker: "w0", ActiveRequests: 1})
	e, ledger, _ := newExchange(t, Config{Addresses: []string{a.addr()}}, Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	require.Eventually(t, func() bool { return len(ledger.get()) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	<-done
	assert.Empty(t, ledger.get())
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
		{"interval too short", func(c *Config) { c.Interval = time.Millisecond }, "peers.interval"},
		{"stale before a poll could answer", func(c *Config) { c.StaleAfter = c.Interval / 2 }, "peers.stale_after"},
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
