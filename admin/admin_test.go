package admin

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/peers"
)

func TestChangesAreAcceptedFromLoopbackOnly(t *testing.T) {
	changed := 0
	policy := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { changed++ })
	tests := []struct {
		name        string
		allowRemote bool
		method      string
		path        string
		remote      string
		want        int
		local       string // the connection's local address; "" leaves it unset
		header      string // a proxy header to send
		host        string // the Host header; "" is localhost:9090
		browser     string // "site origin": the Sec-Fetch-Site and Origin a browser sends
	}{
		{"a change from loopback", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "", "", "", ""},
		{"a change from IPv6 loopback", false, http.MethodPatch, "/policy", "[::1]:5555", http.StatusOK, "", "", "", ""},
		{"a change from the network", false, http.MethodPut, "/policy", "10.1.2.3:5555", http.StatusForbidden, "", "", "", ""},
		{"a reload from the network", false, http.MethodPost, "/reload", "10.1.2.3:5555", http.StatusForbidden, "", "", "", ""},
		{"a read from the network", false, http.MethodGet, "/policy", "10.1.2.3:5555", http.StatusOK, "", "", "", ""},
		{"a change from the network when allowed", true, http.MethodPut, "/policy", "10.1.2.3:5555", http.StatusOK, "", "", "", ""},
		{"an unparseable remote", false, http.MethodPut, "/policy", "somewhere", http.StatusForbidden, "", "", "", ""},
		{"a profile from the network", false, http.MethodGet, "/debug/pprof/", "10.1.2.3:5555", http.StatusForbidden, "", "", "", ""},
		{"a profile from loopback", false, http.MethodGet, "/debug/pprof/", "127.0.0.1:5555", http.StatusOK, "", "", "", ""},
		{"a change from loopback to loopback", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "127.0.0.1:9090", "", "", ""},
		{"a change through a sidecar: a loopback peer on the pod's address", false, http.MethodPut, "/policy", "127.0.0.6:5555", http.StatusForbidden, "10.0.0.7:9090", "", "", ""},
		{"a reload through a sidecar", false, http.MethodPost, "/reload", "127.0.0.1:5555", http.StatusForbidden, "10.0.0.7:9090", "", "", ""},
		{"a change forwarded by a proxy on this host", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusForbidden, "127.0.0.1:9090", "X-Forwarded-For", "", ""},
		{"a change with a Forwarded header", false, http.MethodPut, "/policy", "[::1]:5555", http.StatusForbidden, "", "Forwarded", "", ""},
		{"a read through a sidecar", false, http.MethodGet, "/policy", "127.0.0.6:5555", http.StatusOK, "10.0.0.7:9090", "", "", ""},
		{"a change addressed to 127.0.0.1", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "127.0.0.1:9090", "", "127.0.0.1:9090", ""},
		{"a change addressed to [::1]", false, http.MethodPut, "/policy", "[::1]:5555", http.StatusOK, "", "", "[::1]:9090", ""},
		{"a change addressed to localhost without a port", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "", "", "localhost", ""},
		{"a change through DNS rebinding: loopback, addressed to another name", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusForbidden, "127.0.0.1:9090", "", "rebind.example:9090", ""},
		{"a reload through DNS rebinding", false, http.MethodPost, "/reload", "127.0.0.1:5555", http.StatusForbidden, "127.0.0.1:9090", "", "rebind.example", ""},
		{"a profile through DNS rebinding", false, http.MethodGet, "/debug/pprof/", "127.0.0.1:5555", http.StatusForbidden, "", "", "rebind.example:9090", ""},
		{"a change over TLS addressed to the certificate's name", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "", "", "tls:kvroute-admin.example:9090", ""},
		{"a read addressed to another name", false, http.MethodGet, "/policy", "127.0.0.1:5555", http.StatusOK, "", "", "rebind.example:9090", ""},
		{"a cross-site form posting a reload", false, http.MethodPost, "/reload", "127.0.0.1:5555", http.StatusForbidden, "", "", "", "cross-site http://page.example"},
		{"a cross-site change when remote changes are allowed", true, http.MethodPut, "/policy", "10.1.2.3:5555", http.StatusForbidden, "", "", "", "cross-site http://page.example"},
		{"an older browser's cross-origin change (Origin only)", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusForbidden, "", "", "", " http://page.example"},
		{"a same-origin change from a page on the admin port", false, http.MethodPut, "/policy", "127.0.0.1:5555", http.StatusOK, "", "", "", "same-origin http://localhost:9090"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := Handler(Config{RemoteChanges: tt.allowRemote, Pprof: true}, Deps{
				Gatherer: prometheus.NewRegistry(), Ready: func() bool { return true }, Policy: policy,
				Reload: func() (any, error) { changed++; return map[string]int{"workers": 1}, nil },
			})
			require.NoError(t, err)
			before := changed
			req := httptest.NewRequest(tt.method, tt.path, strings.NewReader("{}"))
			req.RemoteAddr = tt.remote
			if tt.local != "" {
				local, err := net.ResolveTCPAddr("tcp", tt.local)
				require.NoError(t, err)
				req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, net.Addr(local)))
			}
			if tt.header != "" {
				req.Header.Set(tt.header, "10.1.2.3")
			}
			req.Host = "localhost:9090"
			if tt.host != "" {
				host, overTLS := strings.CutPrefix(tt.host, "tls:")
				req.Host = host
				if overTLS {
					req.TLS = &tls.ConnectionState{ServerName: strings.Split(host, ":")[0]}
				}
			}
			if tt.browser != "" {
				site, origin, _ := strings.Cut(tt.browser, " ")
				if site != "" {
					req.Header.Set("Sec-Fetch-Site", site)
				}
				req.Header.Set("Origin", origin)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tt.want, rec.Code)
			if !strings.HasPrefix(tt.path, "/debug") {
				assert.Equal(t, tt.want == http.StatusOK, changed == before+1, "the handler ran only when allowed")
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	ready := false
	reloadErr := errors.New("reload: block_size changed")
	h, err := Handler(Config{}, Deps{Gatherer: prometheus.NewRegistry(), Ready: func() bool { return ready },
		Reload: func() (any, error) { return nil, reloadErr }})
	require.NoError(t, err)
	get := func(method, path string) (int, string) {
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr = "127.0.0.1:1"
		req.Host = "127.0.0.1:9090"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, _ := get(http.MethodGet, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "not ready yet")
	ready = true
	code, _ = get(http.MethodGet, "/readyz")
	assert.Equal(t, http.StatusOK, code)
	code, _ = get(http.MethodGet, "/healthz")
	assert.Equal(t, http.StatusOK, code)
	code, body := get(http.MethodPost, "/reload")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.JSONEq(t, `{"error":"reload: block_size changed"}`, body)
	code, _ = get(http.MethodGet, "/debug/pprof/")
	assert.Equal(t, http.StatusNotFound, code, "profiles are off unless enabled")
	code, _ = get(http.MethodGet, "/policy")
	assert.Equal(t, http.StatusNotFound, code, "no policy handler, no route")
}

func TestExposureWarnings(t *testing.T) {
	tests := []struct {
		addr   string
		cfg    Config
		warned int
	}{
		{"127.0.0.1:9090", Config{RemoteChanges: true, Pprof: true}, 0},
		{"[::1]:9090", Config{RemoteChanges: true}, 0},
		{"localhost:9090", Config{RemoteChanges: true}, 0},
		{"0.0.0.0:9090", Config{}, 0},
		{":9090", Config{Pprof: true}, 0},
		{"0.0.0.0:9090", Config{RemoteChanges: true}, 1},
		{":9090", Config{RemoteChanges: true}, 1},
		{"[::]:9090", Config{RemoteChanges: true}, 1},
		{"10.0.0.5:9090", Config{RemoteChanges: true}, 1},
		{"admin.internal:9090", Config{RemoteChanges: true}, 1},
		{"0.0.0.0:9090", Config{RemoteChanges: true, Pprof: true}, 2},
		{"0.0.0.0:9090", Config{RemoteChanges: true, Pprof: true, ClientCertificates: true}, 2},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %+v", tt.addr, tt.cfg), func(t *testing.T) {
			got := ExposureWarnings(tt.addr, tt.cfg)
			assert.Len(t, got, tt.warned, "%q", got)
			for _, w := range got {
				assert.Contains(t, w, "admin_remote_changes: true")
				// With a client CA, the warning names who may change routing: the
				// holders of its certificates, not whoever reaches the port.
				assert.Equal(t, tt.cfg.ClientCertificates, strings.Contains(w, "certificate of admin_tls.client_ca_file"), w)
			}
		})
	}
}

func TestDecisionsAreServedOnGETOnly(t *testing.T) {
	decisions := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"decisions":[]}`)) })
	h, err := Handler(Config{}, Deps{Gatherer: prometheus.NewRegistry(), Ready: func() bool { return true }, Decisions: decisions})
	require.NoError(t, err)
	for _, tt := range []struct {
		method string
		want   int
	}{{http.MethodGet, http.StatusOK}, {http.MethodPost, http.StatusMethodNotAllowed}} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, "/decisions?limit=3", nil))
		assert.Equal(t, tt.want, rec.Code, tt.method)
	}
}

// IsLoopback takes a listen address as the server binds it: "localhost" binds loopback
// alone, as ExposureWarnings already says. Read as remote, admin_address:
// localhost:9090 with peers elsewhere went without the warning that the other
// replicas cannot read this one's load.
func TestIsLoopbackTakesListenAddresses(t *testing.T) {
	tests := []struct {
		addr       string
		loopback   bool
		peersWarns bool
	}{
		{"127.0.0.1:9090", true, true},
		{"[::1]:9090", true, true},
		{"localhost:9090", true, true},
		{"LocalHost:9090", true, true},
		{":9090", false, false},
		{"0.0.0.0:9090", false, false},
		{"10.0.0.5:9090", false, false},
		{"admin.internal:9090", false, false},
	}
	remotePeers := peers.Config{Addresses: []string{"10.0.0.6:9090"}}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			assert.Equal(t, tt.loopback, IsLoopback(tt.addr))
			assert.Equal(t, tt.loopback, len(ExposureWarnings(tt.addr, Config{RemoteChanges: true})) == 0, "the exposure warnings agree")
			assert.Equal(t, tt.peersWarns, remotePeers.UnreachableWarning(tt.addr, IsLoopback) != "")
		})
	}
	assert.Empty(t, peers.Config{Addresses: []string{"localhost:9091"}}.UnreachableWarning("localhost:9090", IsLoopback),
		"a peer on this host reaches a loopback admin port")
}

// serveLikeExtproc serves h on loopback as cmd/extproc's admin server does (header
// timeout, idle timeout, no read or write timeout of its own).
func serveLikeExtproc(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadHeaderTimeout, srv.Config.IdleTimeout = 10*time.Second, 2*time.Minute
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// A request that announces a body and never sends it must not hold its connection
// (and a handler goroutine) past the body timeout: net/http reads what a handler left
// unread before it answers, and the admin server has no read timeout beyond the
// headers. Any endpoint will do, a GET too.
func TestABodyThatNeverArrivesDoesNotHoldTheConnection(t *testing.T) {
	defer func(d time.Duration) { bodyTimeout = d }(bodyTimeout)
	bodyTimeout = 200 * time.Millisecond
	h, err := Handler(Config{}, Deps{Gatherer: prometheus.NewRegistry(), Ready: func() bool { return true },
		Policy: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})})
	require.NoError(t, err)
	addr := serveLikeExtproc(t, h)
	for _, req := range []string{
		"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n",
		"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
		"PUT /policy HTTP/1.1\r\nHost: 10.0.0.1\r\nContent-Length: 10\r\n\r\n", // refused (403) unread
	} {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte(req))
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, conn.SetReadDeadline(start.Add(5*time.Second)))
		_, err = io.ReadAll(conn) // the answer, then the server's close
		require.NoError(t, err, "%q: the connection is still open after %s", strings.SplitN(req, "\r\n", 2)[0], time.Since(start))
	}
}

// A client that stops reading must not hold a handler goroutine, and the answer it
// buffers, past the write timeout (a /decisions or /workers answer of a large fleet is
// megabytes: more than the socket buffers hold).
func TestAClientThatStopsReadingDoesNotHoldTheHandler(t *testing.T) {
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 300 * time.Millisecond
	returned := make(chan error, 1)
	big := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 1<<20)
		var err error
		for range 256 { // 256 MiB: beyond any socket buffer
			if _, err = w.Write(chunk); err != nil {
				break
			}
		}
		returned <- err
	})
	h, err := Handler(Config{}, Deps{Gatherer: prometheus.NewRegistry(), Ready: func() bool { return true }, Workers: big})
	require.NoError(t, err)
	addr := serveLikeExtproc(t, h)
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	_, err = conn.Write([]byte("GET /workers HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
	require.NoError(t, err)
	select {
	case err := <-returned:
		require.Error(t, err, "the whole answer was written to a client that reads nothing")
	case <-time.After(5 * time.Second):
		t.Fatal("the handler is still writing to a client that stopped reading")
	}
}
