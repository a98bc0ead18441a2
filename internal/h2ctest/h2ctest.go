// Package h2ctest serves tests an engine that speaks HTTP/2 over cleartext alone, as
// the model servers of an InferencePool with appProtocol kubernetes.io/h2c may.
package h2ctest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// NewServer starts a loopback server of h that speaks h2c with prior knowledge and
// nothing else: a connection that opens with an HTTP/1.1 request is closed unanswered,
// so a client that does not speak h2c fails against it. It is closed when the test
// ends.
func NewServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// NewEngine starts a loopback engine of h: h2c-only (NewServer) when h2cOnly, else a
// plain HTTP/1.1 server. It is closed when the test ends.
func NewEngine(t testing.TB, h http.Handler, h2cOnly bool) *httptest.Server {
	t.Helper()
	if h2cOnly {
		return NewServer(t, h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
