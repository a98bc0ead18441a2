package server

import (
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/kvroute/kvroute/internal/tlsfiles"
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
// (and a client CA that parses), naming the YAML key at fault under `tls`.
func (c TLSConfig) Validate() error { return c.ValidateSection("tls") }

// ValidateSection is Validate for the section named section (e.g. "admin_tls").
func (c TLSConfig) ValidateSection(section string) error {
	if !c.Enabled() {
		return nil
	}
	switch {
	case c.CertFile == "":
		return fmt.Errorf("%s.cert_file: required when %s is set", section, section)
	case c.KeyFile == "":
		return fmt.Errorf("%s.key_file: required when %s is set", section, section)
	}
	_, err := loadTLSFiles(c, section, nil)
	return err
}

// CertReloader serves a TLSConfig's files as a *tls.Config that picks up new files:
// before each handshake it compares the files' size and modification time with the
// loaded ones and reloads on a change, so a rotated certificate (cert-manager, a
// Kubernetes secret volume) is served from the next connection on, without a restart.
// A change that does not load (a key written before its certificate, say) keeps the
// last good files and is logged once. Safe for concurrent use.
type CertReloader struct {
	files *tlsfiles.Reloader
}

// NewCertReloader loads the `tls` section's files for the gRPC listener (ALPN h2); a
// nil log discards.
func NewCertReloader(cfg TLSConfig, log *slog.Logger) (*CertReloader, error) {
	return newCertReloader(cfg, "tls", []string{"h2"}, log)
}

// NewHTTPCertReloader loads the files of the section named section for an HTTP/1.1
// listener (the admin port); a nil log discards.
func NewHTTPCertReloader(cfg TLSConfig, section string, log *slog.Logger) (*CertReloader, error) {
	return newCertReloader(cfg, section, []string{"http/1.1"}, log)
}

func newCertReloader(cfg TLSConfig, section string, protos []string, log *slog.Logger) (*CertReloader, error) {
	files, err := tlsfiles.New(section, []string{cfg.CertFile, cfg.KeyFile, cfg.ClientCAFile},
		func() (*tls.Config, error) { return loadTLSFiles(cfg, section, protos) }, log)
	if err != nil {
		return nil, err
	}
	return &CertReloader{files: files}, nil
}

// TLSConfig returns the listener's *tls.Config: each handshake gets the current files'.
func (r *CertReloader) TLSConfig() *tls.Config {
	current := r.files.Current()
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// gRPC requires ALPN h2 (grpc-go refuses a TLS connection without it); net/http
		// reads the listener's protocols here.
		NextProtos:         current.NextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.files.Current(), nil },
	}
}

// loadTLSFiles builds the per-connection config from the files, for a listener speaking
// protos (ALPN); errors name the keys under section.
func loadTLSFiles(c TLSConfig, section string, protos []string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s.cert_file/%s.key_file: %w", section, section, err)
	}
	out := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: protos, Certificates: []tls.Certificate{cert}}
	if c.ClientCAFile != "" {
		pool, err := tlsfiles.CertPool(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.client_ca_file: %w", section, err)
		}
		out.ClientCAs, out.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return out, nil
}
