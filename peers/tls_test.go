package peers

import (
	"context"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/internal/testcerts"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
)

// TestPeersOverMutualTLS: a peer's admin port served with admin_tls and a client CA (as
// cmd/extproc serves it) is watched over TLS by a replica whose peers.tls trusts the
// admin CA and presents a client certificate of the client CA. A watcher without the
// client certificate, trusting another CA, expecting another server name, or speaking
// plain HTTP is not served, and counts nothing of the peer.
func TestPeersOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	load := map[string]scoring.Load{"w0": {ActiveRequests: 2, PrefillTokens: 300}}
	peer, adminCA, clientCA, otherCA := mutualTLSPeer(t, dir, load)
	addr := strings.TrimPrefix(peer.URL, "https://")

	clientCert, clientKey := clientCA.ClientPEM(t, "replica-b")
	strangerCert, strangerKey := otherCA.ClientPEM(t, "stranger")
	withClient := TLSConfig{
		CAFile:   testcerts.Write(t, dir, "admin-ca.crt", adminCA.CertPEM),
		CertFile: testcerts.Write(t, dir, "client.crt", clientCert),
		KeyFile:  testcerts.Write(t, dir, "client.key", clientKey),
	}
	for _, tt := range []struct {
		name    string
		tls     TLSConfig
		counted bool
	}{
		{"the admin CA and a client certificate", withClient, true},
		{"server_name the certificate names", func() TLSConfig { c := withClient; c.ServerName = "kvroute-peers"; return c }(), true},
		{"server_name it does not name", func() TLSConfig { c := withClient; c.ServerName = "kvroute-other"; return c }(), false},
		{"no client certificate", TLSConfig{CAFile: withClient.CAFile}, false},
		{"a client certificate of another CA", func() TLSConfig {
			c := withClient
			c.CertFile, c.KeyFile = testcerts.Write(t, dir, "stranger.crt", strangerCert), testcerts.Write(t, dir, "stranger.key", strangerKey)
			return c
		}(), false},
		{"trusting another CA", func() TLSConfig {
			c := withClient
			c.CAFile = testcerts.Write(t, dir, "other-ca.crt", otherCA.CertPEM)
			return c
		}(), false},
		{"plain HTTP", TLSConfig{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, ledger := runExchange(t, Config{Addresses: []string{addr}, TLS: tt.tls}, Deps{Metrics: NewMetrics(prometheus.NewRegistry())})
			if tt.counted {
				eventuallyLedger(t, ledger, load, "the peer's load, over TLS")
				return
			}
			require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 1 }, waitFor, pollAt)
			assert.Empty(t, ledger.get(), "nothing counted from a peer this replica cannot watch")
		})
	}
}

// TestTLSConfigErrorsNameTheKey: peers.tls refuses files that do not load, by key.
func TestTLSConfigErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	certPEM, keyPEM := ca.ClientPEM(t, "replica")
	cert, key := testcerts.Write(t, dir, "c.crt", certPEM), testcerts.Write(t, dir, "c.key", keyPEM)
	garbage := testcerts.Write(t, dir, "garbage", []byte("not PEM"))
	for _, tt := range []struct {
		name string
		tls  TLSConfig
		want string // "" = valid
	}{
		{"off", TLSConfig{}, ""},
		{"a CA alone (server authentication only)", TLSConfig{CAFile: testcerts.Write(t, dir, "ca.crt", ca.CertPEM)}, ""},
		{"a server name alone (system roots)", TLSConfig{ServerName: "kvroute-peers"}, ""},
		{"a client certificate", TLSConfig{CertFile: cert, KeyFile: key}, ""},
		{"a certificate without its key", TLSConfig{CertFile: cert}, "peers.tls.key_file: required"},
		{"a key without its certificate", TLSConfig{KeyFile: key}, "peers.tls.cert_file: required"},
		{"a key of another certificate", TLSConfig{CertFile: cert, KeyFile: garbage}, "peers.tls.cert_file/peers.tls.key_file"},
		{"a CA that is not PEM", TLSConfig{CAFile: garbage}, "peers.tls.ca_file: no PEM certificate"},
		{"a missing CA", TLSConfig{CAFile: dir + "/none"}, "peers.tls.ca_file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Addresses, cfg.TLS = []string{"kvroute-0:9090"}, tt.tls
			err := cfg.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestTLSFailuresAreWarnedOnce: a peer this replica cannot watch for TLS (its
// certificate does not verify, it refuses this replica's, or it speaks no TLS) is a
// misconfiguration: warned of once, not at each retry, and not only at debug level.
func TestTLSFailuresAreWarnedOnce(t *testing.T) {
	dir := t.TempDir()
	load := map[string]scoring.Load{"w0": {ActiveRequests: 1}}
	tlsPeer, adminCA, _, otherCA := mutualTLSPeer(t, dir, load)
	plainPeer := newFakePeer(t, "p", load)
	adminCAFile := testcerts.Write(t, dir, "admin-ca.crt", adminCA.CertPEM)
	for _, tt := range []struct {
		name, addr string
		tls        TLSConfig
	}{
		{"the peer's certificate does not verify", strings.TrimPrefix(tlsPeer.URL, "https://"), TLSConfig{CAFile: testcerts.Write(t, dir, "other-ca.crt", otherCA.CertPEM)}},
		{"the peer refuses this replica for want of a client certificate", strings.TrimPrefix(tlsPeer.URL, "https://"), TLSConfig{CAFile: adminCAFile}},
		{"the peer speaks plain HTTP", plainPeer.addr(), TLSConfig{CAFile: adminCAFile}},
		{"the peer serves TLS, this replica watches in plain HTTP", strings.TrimPrefix(tlsPeer.URL, "https://"), TLSConfig{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logs := &logbuf.Buffer{}
			e, ledger := runExchange(t, Config{Addresses: []string{tt.addr}, TLS: tt.tls}, Deps{Metrics: NewMetrics(prometheus.NewRegistry()),
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 3 }, waitFor, pollAt, "refused, and retried")
			assert.Empty(t, ledger.get(), "nothing counted")
			assert.Equal(t, 1, strings.Count(logs.String(), "TLS with the peer fails"), "warned once: %s", logs.String())
		})
	}
}

// TestPeersTLSClientCertificateIsReloaded: peers.tls.cert_file and key_file are read
// again when they change: a replica whose client certificate the peer refuses counts
// the peer from the first connection after the files are replaced by one it accepts.
func TestPeersTLSClientCertificateIsReloaded(t *testing.T) {
	dir := t.TempDir()
	load := map[string]scoring.Load{"w0": {ActiveRequests: 2}}
	peer, adminCA, clientCA, otherCA := mutualTLSPeer(t, dir, load)

	strangerCert, strangerKey := otherCA.ClientPEM(t, "replica-b")
	cfg := TLSConfig{
		CAFile:     testcerts.Write(t, dir, "admin-ca.crt", adminCA.CertPEM),
		CertFile:   testcerts.Write(t, dir, "client.crt", strangerCert),
		KeyFile:    testcerts.Write(t, dir, "client.key", strangerKey),
		ServerName: "kvroute-peers",
	}
	e, ledger := runExchange(t, Config{Addresses: []string{strings.TrimPrefix(peer.URL, "https://")}, TLS: cfg}, Deps{Metrics: NewMetrics(prometheus.NewRegistry())})
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 1 }, waitFor, pollAt, "refused first")
	assert.Empty(t, ledger.get())

	goodCert, goodKey := clientCA.ClientPEM(t, "replica-b")
	testcerts.Write(t, dir, "client.key", goodKey) // as a rotation does: one file, then the other
	testcerts.Write(t, dir, "client.crt", goodCert)
	eventuallyLedger(t, ledger, load, "counted with the rotated client certificate")
}

// TestAHungTLSHandshakeHoldsNothing: a peer that accepts connections and never answers
// the TLS handshake does not keep another peer from being counted, and Run still ends
// promptly (its dials are cancelled rather than left to their timeout).
func TestAHungTLSHandshakeHoldsNothing(t *testing.T) {
	dir := t.TempDir()
	adminCA := testcerts.NewCA(t, "admin CA")
	serverCert, serverKey := adminCA.Server(t, "kvroute-peers")
	certs, err := server.NewHTTPCertReloader(server.TLSConfig{
		CertFile: testcerts.Write(t, dir, "admin.crt", serverCert),
		KeyFile:  testcerts.Write(t, dir, "admin.key", serverKey),
	}, "admin_tls", nil)
	require.NoError(t, err)
	load := map[string]scoring.Load{"w0": {ActiveRequests: 2}}
	good := httptest.NewUnstartedServer(Handler("a", newFakeBookings(load), HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 8}))
	good.TLS = certs.TLSConfig()
	good.StartTLS()
	t.Cleanup(func() { stopServer(good) })

	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		hung.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})

	e, err := New(Config{Addresses: []string{hung.Addr().String(), strings.TrimPrefix(good.URL, "https://")},
		Interval: DefaultConfig().Interval, StaleAfter: 2 * Heartbeat, ResolveInterval: DefaultConfig().ResolveInterval,
		TLS: TLSConfig{CAFile: testcerts.Write(t, dir, "admin-ca.crt", adminCA.CertPEM)}},
		Deps{Ledger: &fakeLedger{peers: map[string]scoring.Load{}}, Replica: "me", Metrics: NewMetrics(prometheus.NewRegistry())})
	require.NoError(t, err)
	ledger := e.deps.Ledger.(*fakeLedger)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	eventuallyLedger(t, ledger, load, "the answering peer counted")
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.deps.Metrics.disconnects) >= 1 }, waitFor, pollAt, "the hung peer cut off at stale_after")
	cancel()
	select {
	case <-done:
	case <-time.After(tlsHandshakeTimeout / 2):
		t.Fatal("Run waited for a hung TLS handshake")
	}
	assert.Empty(t, ledger.get(), "withdrawn")
}

// TestServerNameIsTheAddressHost: without peers.tls.server_name a peer's certificate is
// checked against the host it is dialled at, an IPv6 literal without brackets or zone.
func TestServerNameIsTheAddressHost(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.5:9090":          "10.0.0.5",
		"kvroute-0.kvroute:9090": "kvroute-0.kvroute",
		"[fd00::1]:9090":         "fd00::1",
		"[fe80::1%eth0]:9090":    "fe80::1",
	} {
		got, err := serverName(addr)
		require.NoError(t, err, addr)
		assert.Equal(t, want, got, addr)
	}
	_, err := serverName("no-port")
	assert.Error(t, err)
}

// mutualTLSPeer serves a replica's /peers/load (load on w0) over TLS with a
// certificate for "kvroute-peers" from adminCA, accepting only clients with a
// certificate from clientCA; otherCA signs neither. Its files are written under dir;
// it stops with the test.
func mutualTLSPeer(t *testing.T, dir string, load map[string]scoring.Load) (peer *httptest.Server, adminCA, clientCA, otherCA *testcerts.CA) {
	t.Helper()
	adminCA, clientCA, otherCA = testcerts.NewCA(t, "admin CA"), testcerts.NewCA(t, "client CA"), testcerts.NewCA(t, "other CA")
	serverCert, serverKey := adminCA.Server(t, "kvroute-peers")
	certs, err := server.NewHTTPCertReloader(server.TLSConfig{
		CertFile:     testcerts.Write(t, dir, "admin.crt", serverCert),
		KeyFile:      testcerts.Write(t, dir, "admin.key", serverKey),
		ClientCAFile: testcerts.Write(t, dir, "client-ca.crt", clientCA.CertPEM),
	}, "admin_tls", nil)
	require.NoError(t, err)
	peer = httptest.NewUnstartedServer(Handler("a", newFakeBookings(load), HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 8}))
	peer.TLS = certs.TLSConfig()
	peer.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	peer.StartTLS()
	t.Cleanup(func() { stopServer(peer) })
	return peer, adminCA, clientCA, otherCA
}
