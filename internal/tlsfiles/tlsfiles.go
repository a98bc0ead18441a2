// Package tlsfiles keeps a *tls.Config built from PEM files and builds it again when
// the files change: cert-manager and Kubernetes secret volumes rotate certificates in
// place, and a listener or a client must pick them up without a restart.
package tlsfiles

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Reloader serves the config last built from its files. Before each use it compares the
// files' size, modification time and inode with those it last tried and builds the config
// again on a change. A change that does not build (a key written before its certificate,
// say) keeps the last good config and is logged once. Safe for concurrent use.
type Reloader struct {
	section string // the config section the files come from, for the logs
	paths   []string
	build   func() (*tls.Config, error)
	log     *slog.Logger

	mu     sync.Mutex
	seen   []stamp     // the stamps of the files last tried
	loaded *tls.Config // built from the last good files
}

// stamp is what tells a changed file: its size, modification time and inode (zero
// when the file is absent or its path empty).
type stamp struct {
	size  int64
	mod   time.Time
	inode uint64
}

// New builds the config once (its error is returned as is: build names the keys) and
// returns a Reloader that builds it again whenever one of paths changes. Empty paths are
// ignored. section names the config section in the logs; a nil log discards.
func New(section string, paths []string, build func() (*tls.Config, error), log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{section: section, paths: paths, build: build, log: log}
	// Stamp before building, as Current does: a file replaced while build reads it is
	// then seen as changed at the next use, not taken as the one built.
	seen := r.stamps()
	loaded, err := build()
	if err != nil {
		return nil, err
	}
	r.loaded, r.seen = loaded, seen
	return r, nil
}

// Current returns the config of the newest files that build. Callers must not modify it.
func (r *Reloader) Current() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamps := r.stamps()
	if !equal(stamps, r.seen) {
		r.seen = stamps
		if loaded, err := r.build(); err != nil {
			r.log.Error(r.section+": the changed certificate files do not load; using the previous ones", "error", err)
		} else {
			r.loaded = loaded
			r.log.Info(r.section+": certificate files reloaded", "files", r.paths)
		}
	}
	return r.loaded
}

func (r *Reloader) stamps() []stamp {
	out := make([]stamp, len(r.paths))
	for i, path := range r.paths {
		if path == "" {
			continue
		}
		if fi, err := os.Stat(path); err == nil {
			out[i] = stamp{size: fi.Size(), mod: fi.ModTime(), inode: inode(fi)}
		}
	}
	return out
}

func equal(a, b []stamp) bool {
	for i := range a {
		if a[i].size != b[i].size || !a[i].mod.Equal(b[i].mod) || a[i].inode != b[i].inode {
			return false
		}
	}
	return true
}

// CertPool reads a PEM CA bundle (a client CA for a listener, the roots a client
// trusts). Errors do not name the config key; callers prefix it.
func CertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bytes.TrimSpace(pem)) {
		return nil, fmt.Errorf("no PEM certificate in %s", path)
	}
	return pool, nil
}
