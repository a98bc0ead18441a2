package config

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/testcerts"
)

// TestAdminAndPeersTLSGoTogether: the admin port's TLS (admin_tls) and the peers'
// (peers.tls) are checked by key, and a config in which this replica would watch the
// others in another protocol than it serves is refused: the replicas share one
// config, so each serves what the others speak.
func TestAdminAndPeersTLSGoTogether(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ca")
	serverCert, serverKey := ca.Server(t, "kvroute")
	clientCert, clientKey := ca.ClientPEM(t, "replica")
	crt, key := testcerts.Write(t, dir, "admin.crt", serverCert), testcerts.Write(t, dir, "admin.key", serverKey)
	caFile := testcerts.Write(t, dir, "ca.crt", ca.CertPEM)
	ccrt, ckey := testcerts.Write(t, dir, "c.crt", clientCert), testcerts.Write(t, dir, "c.key", clientKey)
	adminTLS := fmt.Sprintf("admin_tls: {cert_file: %s, key_file: %s, client_ca_file: %s}\n", crt, key, caFile)
	peersTLS := fmt.Sprintf("  tls: {ca_file: %s, cert_file: %s, key_file: %s, server_name: kvroute}\n", caFile, ccrt, ckey)
	for _, tt := range []struct {
		name string
		yaml string
		want string // "" = valid
	}{
		{"admin_tls alone (no peers)", adminTLS, ""},
		{"both, with peers", adminTLS + "peers:\n  dns: kvroute-peers:9090\n" + peersTLS, ""},
		{"admin_tls without its key", "admin_tls: {cert_file: " + crt + "}\n", "admin_tls.key_file: required"},
		{"admin_tls with a key of another certificate", "admin_tls: {cert_file: " + crt + ", key_file: " + ckey + "}\n", "admin_tls.cert_file/admin_tls.key_file"},
		{"admin_tls with a client CA that is not PEM", "admin_tls: {cert_file: " + crt + ", key_file: " + key + ", client_ca_file: " + key + "}\n", "admin_tls.client_ca_file"},
		{"peers.tls without peers", adminTLS + "peers:\n" + peersTLS, "peers.tls: set without peers.addresses or peers.dns"},
		{"peers watched over TLS, admin port in plain HTTP", "peers:\n  dns: kvroute-peers:9090\n" + peersTLS, "admin_tls: required with peers.tls"},
		{"admin port over TLS, peers watched in plain HTTP", adminTLS + "peers:\n  dns: kvroute-peers:9090\n", "peers.tls: required when admin_tls is set"},
		{"admin_tls asks for client certificates, peers.tls presents none", adminTLS + "peers:\n  dns: kvroute-peers:9090\n  tls: {ca_file: " + caFile + "}\n", "peers.tls.cert_file: required when admin_tls.client_ca_file is set"},
		{"admin_tls without a client CA, peers.tls without a certificate", fmt.Sprintf("admin_tls: {cert_file: %s, key_file: %s}\n", crt, key) + "peers:\n  dns: kvroute-peers:9090\n  tls: {ca_file: " + caFile + "}\n", ""},
		{"peers.tls with a certificate but no key", adminTLS + "peers:\n  dns: kvroute-peers:9090\n  tls: {cert_file: " + ccrt + "}\n", "peers.tls.key_file: required"},
		{"unknown peers.tls key", adminTLS + "peers:\n  dns: kvroute-peers:9090\n  tls: {ca: " + caFile + "}\n", "field ca not found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal + tt.yaml))
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}

	running, err := Parse([]byte(minimal + adminTLS))
	require.NoError(t, err)
	next := running
	next.AdminTLS.ClientCAFile = ""
	assert.Equal(t, []string{"admin_tls (the files it names are reloaded when they change)"}, RestartKeys(running, next))
}
