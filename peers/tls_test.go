package peers

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	adminCA, clientCA, otherCA := testcerts.NewCA(t, "admin CA"), testcerts.NewCA(t, "client CA"), testcerts.NewCA(t, "other CA")
	serverCert, serverKey := adminCA.Server(t, "kvroute-peers")
	admin := server.TLSConfig{
		CertFile:     testcerts.Write(t, dir, "admin.crt", serverCert),
		KeyFile:      testcerts.Write(t, dir, "admin.key", serverKey),
		ClientCAFile: testcerts.Write(t, dir, "client-ca.crt", clientCA.CertPEM),
	}
	certs, err := server.NewHTTPCertReloader(admin, "admin_tls", nil)
	require.NoError(t, err)
	load := map[string]scoring.Load{"w0": {ActiveRequests: 2, PrefillTokens: 300}}
	peer := httptest.NewUnstartedServer(Handler("a", newFakeBookings(load), HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 8}))
	peer.TLS = certs.TLSConfig()
	peer.StartTLS()
	t.Cleanup(func() { stopServer(peer) })
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
