package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// TLSConfig is the `tls` section of kvroute's config: TLS on the ext_proc listener, and
// mTLS when a client CA is given. The zero value is off (plaintext).
type TLSConfig struct {
	// CertFile and KeyFile are the server's PEM certificate chain and key.
	CertFile string `yaml:"cert_file" json:"cert_file"`
	KeyFile  string `yaml:"key_file" json:"key_file"`
	// ClientCAFile, when set, turns on mTLS: clients (Envoy) must present a certificate
	// signed by one of these PEM CAs.
	ClientCAFile string `yaml:"client_ca_file" json:"client_ca_file"`
}

// Enabled reports whether TLS is configured.
func (c TLSConfig) Enabled() bool { return c != TLSConfig{} }

// Validate checks that a configured TLS section names a certificate and a key that load
// (and a client CA that parses), naming the YAML key at fault.
func (c TLSConfig) Validate() error {
	if !c.Enabled() {
		return nil
	}
	switch {
	case c.CertFile == "":
		return errors.New("tls.cert_file: required when tls is set")
	case c.KeyFile == "":
		return errors.New("tls.key_file: required when tls is set")
	}
	_, err := loadTLSFiles(c)
	return err
}

// CertReloader serves a TLSConfig's files as a *tls.Config that picks up new files:
// before each handshake it compares the files' size and modification time with the
// loaded ones and reloads on a change, so a rotated certificate (cert-manager, a
// Kubernetes secret volume) is served from the next connection on, without a restart.
// A change that does not load (a key written before its certificate, say) keeps the
// last good files and is logged once. Safe for concurrent use.
type CertReloader struct {
	cfg TLSConfig
	log *slog.Logger

	mu     sync.Mutex
	seen   []fileStamp // the stamps of the files last tried
	loaded *tls.Config // built from the last good files
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// NewCertReloader loads cfg's files; a nil log discards.
func NewCertReloader(cfg TLSConfig, log *slog.Logger) (*CertReloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{cfg: cfg, log: log}
	loaded, err := loadTLSFiles(cfg)
	if err != nil {
		return nil, err
	}
	r.loaded, r.seen = loaded, r.stamps()
	return r, nil
}

// TLSConfig returns the listener's *tls.Config: each handshake gets the current files'.
func (r *CertReloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// gRPC requires ALPN h2 (grpc-go refuses a TLS connection without it).
		NextProtos:         []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.current(), nil },
	}
}

// current returns the config of the newest files that load.
func (r *CertReloader) current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps := r.stamps()
	if !equalStamps(stamps, r.seen) {
		r.seen = stamps
		if loaded, err := loadTLSFiles(r.cfg); err != nil {
			r.log.Error("tls: the changed certificate files do not load; serving the previous ones", "error", err)
		} else {
			r.loaded = loaded
			r.log.Info("tls: certificate files reloaded", "cert_file", r.cfg.CertFile)
		}
	}
	return r.loaded
}

func (r *CertReloader) stamps() []fileStamp {
	var out []fileStamp
	for _, path := range []string{r.cfg.CertFile, r.cfg.KeyFile, r.cfg.ClientCAFile} {
		var st fileStamp
		if fi, err := os.Stat(path); err == nil && path != "" {
			st = fileStamp{size: fi.Size(), mod: fi.ModTime()}
		}
		out = append(out, st)
	}
	return out
}

func equalStamps(a, b []fileStamp) bool {
	for i := range a {
		if a[i].size != b[i].size || !a[i].mod.Equal(b[i].mod) {
			return false
		}
	}
	return true
}

// loadTLSFiles builds the per-connection config from the files.
func loadTLSFiles(c TLSConfig) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file/tls.key_file: %w", err)
	}
	out := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}}
	if c.ClientCAFile != "" {
		pem, err := os.ReadFile(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bytes.TrimSpace(pem)) {
			return nil, fmt.Errorf("tls.client_ca_file: no PEM certificate in %s", c.ClientCAFile)
		}
		out.ClientCAs, out.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return out, nil
}
