package peers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/scoring"
)

// panicLedger panics at its first SetPeerLoad, under the exchange's lock: a bug a
// peer's report reaches while its loads are taken.
type panicLedger struct {
	*fakeLedger
	fired atomic.Bool
}

func (l *panicLedger) SetPeerLoad(worker string, load scoring.Load) {
	if l.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
	l.fakeLedger.SetPeerLoad(worker, load)
}

// panicResolver panics at its first lookup, then answers addrs.
type panicResolver struct {
	addrs []string
	fired atomic.Bool
}

func (r *panicResolver) LookupHost(context.Context, string) ([]string, error) {
	if r.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
	return r.addrs, nil
}

// TestAReportWhoseHandlingPanicsIsRefused: a panic while a peer's report is taken is
// recovered and counted, the report refused as an unparseable one is (the stream
// ends, to be reopened), and the exchange's lock is free: the reopened stream's
// reports reach the ledger.
func TestAReportWhoseHandlingPanicsIsRefused(t *testing.T) {
	load := map[string]scoring.Load{"w0": {ActiveRequests: 2}}
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(reportLine("p", load, nil))
		_, _ = w.Write(reportLine("p", load, nil))
	}))
	t.Cleanup(func() { stopServer(peer) })
	addr := strings.TrimPrefix(peer.URL, "http://")
	reg := prometheus.NewRegistry()
	ledger := &panicLedger{fakeLedger: &fakeLedger{peers: map[string]scoring.Load{}}}
	cfg := DefaultConfig()
	cfg.Addresses = []string{addr}
	e, err := New(cfg, Deps{Ledger: ledger, Replica: "me", Metrics: NewMetrics(reg), Panics: background.NewMetrics(reg)})
	require.NoError(t, err)
	ctx := context.Background()

	got, err := e.stream(ctx, addr)
	assert.ErrorIs(t, err, errRefused, "the stream ends as on a report refused")
	assert.ErrorIs(t, err, background.ErrPanicked)
	assert.False(t, got)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopPeers))
	assert.Equal(t, 1.0, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("refused")))
	assert.Zero(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))

	got, err = e.stream(ctx, addr)
	assert.ErrorIs(t, err, errStreamEnded)
	assert.True(t, got, "the reopened stream's reports are taken")
	assert.Equal(t, load, ledger.get())
	assert.Equal(t, 2.0, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopPeers), "one panic, counted once")
}

// TestADNSLookupThatPanicsFails: a panic in a lookup of the peers' DNS name is
// recovered and counted, and the lookup fails: the addresses stay, and the next
// lookup may start.
func TestADNSLookupThatPanicsFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	resolver := &panicResolver{addrs: []string{"127.0.0.1"}}
	cfg := DefaultConfig()
	cfg.DNS = "replicas.test:9090"
	e, err := New(cfg, Deps{Ledger: &fakeLedger{peers: map[string]scoring.Load{}}, Replica: "me",
		Resolver: resolver, Panics: background.NewMetrics(reg)})
	require.NoError(t, err)
	e.resolving = true // as addresses sets it when it starts the lookup
	e.lookUp(context.Background())
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopPeers))
	assert.False(t, e.resolving, "a lookup may start again")
	assert.Empty(t, e.resolved)

	e.resolving = true
	e.lookUp(context.Background())
	assert.Equal(t, []string{"127.0.0.1:9090"}, e.resolved)
}
