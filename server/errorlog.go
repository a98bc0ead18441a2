package server

import (
	"context"
	stdlog "log"
	"log/slog"
	"strings"
)

// HTTPErrorLog is an http.Server's ErrorLog that writes to log instead of stderr: a
// failed TLS handshake (a port scanner, a TCP probe, a client without a certificate
// the client CA signed, retrying) logs a line per connection, so it goes at debug;
// the rest (a handler's panic, say) at warn. A nil log discards.
func HTTPErrorLog(log *slog.Logger, listener string) *stdlog.Logger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return stdlog.New(httpErrorWriter{log: log, listener: listener}, "", 0)
}

type httpErrorWriter struct {
	log      *slog.Logger
	listener string
}

func (w httpErrorWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, w.listener+": "+msg)
	return len(p), nil
}
