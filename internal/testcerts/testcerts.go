// Package testcerts makes throwaway certificate authorities and certificates for tests
// of TLS and mTLS, with crypto/x509 alone: no files from outside, nothing that expires
// during a run (valid for a day from an hour ago).
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	// CertPEM is the CA certificate.
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	serial  int64
}

// NewCA returns a new self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcerts: CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: CA: %v", err)
	}
	return &CA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key, serial: 1}
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Server issues a server certificate for 127.0.0.1 and ::1 (and name as a DNS name);
// it returns the certificate and key in PEM.
func (ca *CA) Server(t testing.TB, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
}

// Client issues a client certificate named name.
func (ca *CA) Client(t testing.TB, name string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.issue(t, name, x509.ExtKeyUsageClientAuth, nil)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("testcerts: client pair: %v", err)
	}
	return pair
}

// ClientPEM issues a client certificate named name; it returns the certificate and key
// in PEM, for configs that name files.
func (ca *CA) ClientPEM(t testing.TB, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageClientAuth, nil)
}

func (ca *CA) issue(t testing.TB, name string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte) {
	t.Helper()
	ca.serial++
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}, IPAddresses: ips,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcerts: issue %s: %v", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testcerts: key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: key: %v", err)
	}
	return key
}

// Write replaces the file at dir/name with data, atomically (a rename, as a Kubernetes
// secret volume swaps its files), and returns its path.
func Write(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		t.Fatalf("testcerts: write %s: %v", name, err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatalf("testcerts: write %s: %v", name, err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatalf("testcerts: write %s: %v", name, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatalf("testcerts: write %s: %v", name, err)
	}
	return path
}
