package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config is the admin port's behaviour.
type Config struct {
	// RemoteChanges lets clients outside loopback change routing (PUT /policy, POST
	// /reload).
	RemoteChanges bool
	// Pprof serves net/http/pprof under /debug/pprof/ (loopback only unless
	// RemoteChanges: a profile reveals what the process holds).
	Pprof bool
	// ClientCertificates says the listener serves only clients presenting a certificate
	// of a client CA (admin_tls.client_ca_file): then "remote" means any holder of one,
	// which the startup warnings say.
	ClientCertificates bool
}

// Deps are what the admin port serves. Gatherer and Ready are required.
type Deps struct {
	Gatherer prometheus.Gatherer
	// Ready reports readiness for /readyz.
	Ready func() bool
	// Policy serves /policy; nil leaves it unmounted.
	Policy http.Handler
	// Reload re-reads the config and returns a JSON-encodable summary; nil leaves
	// /reload unmounted.
	Reload func() (any, error)
	// Decisions serves GET /decisions; nil leaves it unmounted.
	Decisions http.Handler
	// PeerLoad serves GET /peers/load, this replica's booked load for the other
	// replicas (package peers); nil leaves it unmounted.
	PeerLoad http.Handler
	// Workers serves GET /workers, the fleet as this replica sees it (fleet.ViewHandler);
	// nil leaves it unmounted.
	Workers http.Handler
	// Peers serves GET /peers, the other replicas this one hears from
	// (peers.StatusHandler); nil leaves it unmounted.
	Peers http.Handler
}

// Handler returns the admin port's handler.
func Handler(cfg Config, deps Deps) (http.Handler, error) {
	if deps.Gatherer == nil || deps.Ready == nil {
		return nil, errors.New("admin: Gatherer and Ready are required")
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !deps.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if deps.Policy != nil {
		mux.Handle("/policy", fromLoopback(cfg.RemoteChanges, false, deps.Policy))
	}
	if deps.Reload != nil {
		mux.Handle("POST /reload", fromLoopback(cfg.RemoteChanges, false, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			summary, err := deps.Reload()
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, summary)
		})))
	}
	if deps.Decisions != nil {
		mux.Handle("GET /decisions", deps.Decisions)
	}
	if deps.PeerLoad != nil {
		mux.Handle("GET /peers/load", deps.PeerLoad)
	}
	if deps.Peers != nil {
		mux.Handle("GET /peers", deps.Peers)
	}
	if deps.Workers != nil {
		mux.Handle("GET /workers", deps.Workers)
	}
	if cfg.Pprof {
		profiles := http.NewServeMux()
		profiles.HandleFunc("/debug/pprof/", pprof.Index)
		profiles.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		profiles.HandleFunc("/debug/pprof/profile", pprof.Profile)
		profiles.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		profiles.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.Handle("/debug/pprof/", fromLoopback(cfg.RemoteChanges, true, profiles))
	}
	return bounded(mux), nil
}

// bounded gives a request that has a body (announced or chunked) bodyTimeout for it:
// past that, reading it fails, the answer says so or is the handler's, and the
// connection is closed. Requests without one (every GET a client sends, the peers'
// watch streams) are left alone: their connection's next read is for the next request,
// which ReadHeaderTimeout bounds. Every answer but a profile's must be written within
// writeTimeout; a profile takes the seconds it is asked for, and is written with no
// deadline (one left by an earlier request on the connection is cleared).
func bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Not every ResponseWriter can set deadlines (a handler test's recorder).
		rc := http.NewResponseController(w)
		if r.ContentLength != 0 {
			_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
		}
		var written time.Time
		if !strings.HasPrefix(r.URL.Path, "/debug/pprof/") {
			written = time.Now().Add(writeTimeout)
		}
		_ = rc.SetWriteDeadline(written)
		h.ServeHTTP(w, r)
	})
}

// fromLoopback refuses (403) requests from outside loopback unless allowRemote: every
// request when all is set, otherwise those that would change routing (not GET or HEAD).
// A web page open in a browser on this host is outside too, though its requests come
// from loopback: a change a browser sends from another origin is refused (net/http's
// CrossOriginProtection: a cross-site form or fetch), and a request accepted for coming
// from loopback must also be addressed to loopback (its Host a loopback IP or
// localhost), which a page reaching the port through DNS rebinding is not (its Host is
// the page's own name; over TLS the browser would refuse the port's certificate for
// that name, so the check is for plain HTTP only, and `curl --resolve` with the
// certificate's name keeps working).
func fromLoopback(allowRemote, all bool, h http.Handler) http.Handler {
	refuse := func(w http.ResponseWriter, why string) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": why})
	}
	crossOrigin := http.NewCrossOriginProtection()
	crossOrigin.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		refuse(w, "a change sent by a browser from another origin is refused")
	}))
	return crossOrigin.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowRemote && (all || r.Method != http.MethodGet && r.Method != http.MethodHead) {
			switch {
			case !fromThisHost(r):
				refuse(w, "accepted from loopback only (admin_remote_changes: false)")
				return
			case r.TLS == nil && !addressedToLoopback(r.Host):
				refuse(w, "accepted from loopback only when addressed to loopback: the Host header must be a loopback IP or localhost")
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
}

// addressedToLoopback reports whether a request's Host (host or host:port) names
// loopback.
func addressedToLoopback(host string) bool {
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "0")
	}
	return IsLoopback(host)
}

// proxyHeaders say a request was forwarded by a proxy; a client on this host calling
// the admin port directly sends none.
var proxyHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip"}

// fromThisHost reports whether r came straight from a process on this host: from a
// loopback address to a loopback address, with no proxy header. A loopback peer alone
// is not enough: a sidecar proxy (Istio's connects from 127.0.0.6 to the pod's own
// address) makes every client of the pod look local.
func fromThisHost(r *http.Request) bool {
	if !IsLoopback(r.RemoteAddr) {
		return false
	}
	// Set by net/http's server for every request; absent only in handler tests.
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && !IsLoopback(local.String()) {
		return false
	}
	for _, h := range proxyHeaders {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	return true
}

// ExposureWarnings returns what an operator should be warned of at startup about the
// admin port listening on addr: with remote changes on and a listener reachable beyond
// loopback (any address but a loopback IP or localhost: 0.0.0.0, ::, a pod IP, a host
// name), any client that reaches the port can change routing (PUT /policy, POST
// /reload), and read profiles when they are served. With remote changes off, changes
// are refused from beyond loopback whatever the address, so there is nothing to warn of.
func ExposureWarnings(addr string, cfg Config) []string {
	if !cfg.RemoteChanges || IsLoopback(addr) {
		return nil
	}
	who := "any client that reaches admin_address"
	advice := "bind it to loopback or keep it off the network clients reach"
	if cfg.ClientCertificates {
		who = "any client holding a certificate of admin_tls.client_ca_file"
		advice = "give such certificates only to what may change routing"
	}
	out := []string{"admin port: PUT /policy and POST /reload are accepted from " + who + " (admin_remote_changes: true); " + advice}
	if cfg.Pprof {
		out = append(out, "admin port: /debug/pprof is served to "+who+" (admin_remote_changes: true)")
	}
	return out
}

// IsLoopback reports whether a host:port (a request's RemoteAddr, or a listen address)
// is on loopback: a loopback IP, or the name localhost in any case (a listen address
// naming it binds loopback; a request's RemoteAddr is always an IP).
func IsLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// bodyTimeout is how long a request's body may take to arrive, whatever the endpoint:
// the admin server bounds only the headers (ReadHeaderTimeout; a read timeout would cut
// the peers' watch streams), and net/http reads what a handler left of a body before
// it answers, so a request announcing a body it never sends held its connection and a
// goroutine until it closed. A var for tests.
var bodyTimeout = 10 * time.Second

// writeTimeout is how long an answer may take to be written, the profiles' excepted: a
// client that stops reading an answer larger than the socket buffers (/decisions,
// /workers or /metrics of a large fleet: megabytes) held the handler's goroutine, and
// the answer it had encoded, until it closed the connection. The peers' watch streams
// set their own deadline at each write (peers.HandlerOptions.WriteTimeout). A var for
// tests.
var writeTimeout = 2 * time.Minute
