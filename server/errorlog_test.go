package server_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/server"
)

// TestHTTPErrorLogDemotesHandshakeErrors: net/http's per-connection TLS handshake
// errors go to the structured log at debug, anything else at warn.
func TestHTTPErrorLogDemotesHandshakeErrors(t *testing.T) {
	logs := &logbuf.Buffer{}
	l := server.HTTPErrorLog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), "admin port")
	l.Printf("http: TLS handshake error from 10.0.0.1:1234: EOF")
	l.Printf("http: panic serving 10.0.0.1:1234: boom")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if assert.Len(t, lines, 2) {
		assert.Contains(t, lines[0], `level=DEBUG msg="admin port: http: TLS handshake error from 10.0.0.1:1234: EOF"`)
		assert.Contains(t, lines[1], `level=WARN msg="admin port: http: panic serving`)
	}
}
