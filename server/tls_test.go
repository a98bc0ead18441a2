package server_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/internal/testcerts"
	"github.com/kvroute/kvroute/server"
)

func TestTLSConfigErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	certPEM, keyPEM := ca.Server(t, "kvroute")
	cert := testcerts.Write(t, dir, "tls.crt", certPEM)
	key := testcerts.Write(t, dir, "tls.key", keyPEM)
	otherKey := testcerts.Write(t, dir, "other.key", func() []byte { _, k := ca.Server(t, "x"); return k }())
	garbage := testcerts.Write(t, dir, "garbage.pem", []byte("not a certificate"))
	tests := []struct {
		name string
		cfg  server.TLSConfig
		want string // "" = valid
	}{
		{"off", server.TLSConfig{}, ""},
		{"TLS", server.TLSConfig{CertFile: cert, KeyFile: key}, ""},
		{"mTLS", server.TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: testcerts.Write(t, dir, "ca.crt", ca.CertPEM)}, ""},
		{"a key without a certificate", server.TLSConfig{KeyFile: key}, "tls.cert_file: required"},
		{"a client CA alone", server.TLSConfig{ClientCAFile: cert}, "tls.cert_file: required"},
		{"a certificate without a key", server.TLSConfig{CertFile: cert}, "tls.key_file: required"},
		{"a missing file", server.TLSConfig{CertFile: dir + "/missing.crt", KeyFile: key}, "tls.cert_file/tls.key_file"},
		{"a key of another certificate", server.TLSConfig{CertFile: cert, KeyFile: otherKey}, "tls.cert_file/tls.key_file"},
		{"a client CA that is not PEM", server.TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: garbage}, "tls.client_ca_file: no PEM certificate"},
		{"a missing client CA", server.TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: dir + "/none"}, "tls.client_ca_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestCertificatesAreReloadedWhenTheirFilesChange: through a gRPC listener, each new
// connection is served the files as they are then: a rotated server certificate (signed
// by another CA) and a rotated client CA take effect without a restart; files that do
// not load leave the last good ones in service, with one error logged.
func TestCertificatesAreReloadedWhenTheirFilesChange(t *testing.T) {
	dir := t.TempDir()
	serverCA1, serverCA2 := testcerts.NewCA(t, "server CA 1"), testcerts.NewCA(t, "server CA 2")
	clientCA1, clientCA2 := testcerts.NewCA(t, "client CA 1"), testcerts.NewCA(t, "client CA 2")
	certPEM, keyPEM := serverCA1.Server(t, "kvroute")
	cfg := server.TLSConfig{
		CertFile:     testcerts.Write(t, dir, "tls.crt", certPEM),
		KeyFile:      testcerts.Write(t, dir, "tls.key", keyPEM),
		ClientCAFile: testcerts.Write(t, dir, "ca.crt", clientCA1.CertPEM),
	}
	logs := &logbuf.Buffer{}
	certs, err := server.NewCertReloader(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(certs.TLSConfig())))
	healthpb.RegisterHealthServer(gs, grpchealth.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	// check makes a new connection trusting serverCA and presenting client (if any).
	check := func(serverCA *testcerts.CA, client *tls.Certificate) error {
		t.Helper()
		tc := &tls.Config{RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12}
		if client != nil {
			tc.Certificates = []tls.Certificate{*client}
		}
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		require.NoError(t, err)
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err
	}
	client1, client2 := clientCA1.Client(t, "envoy"), clientCA2.Client(t, "envoy")

	assert.NoError(t, check(serverCA1, &client1), "TLS and mTLS")
	assert.Error(t, check(serverCA1, nil), "mTLS: no client certificate")
	assert.Error(t, check(serverCA1, &client2), "mTLS: a client certificate from another CA")
	assert.Error(t, check(serverCA2, &client1), "a client that does not trust the server's CA")

	// Rotate the server certificate to one signed by CA 2.
	certPEM, keyPEM = serverCA2.Server(t, "kvroute")
	testcerts.Write(t, dir, "tls.crt", certPEM)
	testcerts.Write(t, dir, "tls.key", keyPEM)
	assert.NoError(t, check(serverCA2, &client1), "the rotated certificate is served")
	assert.Error(t, check(serverCA1, &client1), "the old one is not")

	// Rotate the client CA.
	testcerts.Write(t, dir, "ca.crt", clientCA2.CertPEM)
	assert.NoError(t, check(serverCA2, &client2), "clients of the new CA are accepted")
	assert.Error(t, check(serverCA2, &client1), "clients of the old CA are not")

	// A broken rotation: the last good files stay in service.
	testcerts.Write(t, dir, "tls.crt", []byte("half-written"))
	assert.NoError(t, check(serverCA2, &client2))
	assert.NoError(t, check(serverCA2, &client2))
	assert.Equal(t, 1, strings.Count(logs.String(), "do not load"), "logged once per change: %s", logs.String())
	assert.Equal(t, 2, strings.Count(logs.String(), "certificate files reloaded"))
}
