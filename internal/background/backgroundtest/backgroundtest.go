// Package backgroundtest helps test the background loops package background guards:
// it reads the panics they counted, and plays a panic where an engine's answer is read.
package backgroundtest

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Panics returns kvroute_background_panics_total{loop} as g gathers it; 0 when the
// series does not exist.
func Panics(t testing.TB, g prometheus.Gatherer, loop string) float64 {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "kvroute_background_panics_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "loop" && l.GetValue() == loop {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// PanicOnce is an http.RoundTripper that panics at its first request to Host (an
// ip:port) and sends every other request on through http.DefaultTransport. An
// http.Client calls it in the caller's goroutine: it plays a bug that an engine's
// answer reaches while a poller reads it.
type PanicOnce struct {
	Host  string
	fired atomic.Bool
}

// RoundTrip implements http.RoundTripper.
func (p *PanicOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host == p.Host && p.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
	return http.DefaultTransport.RoundTrip(r)
}
