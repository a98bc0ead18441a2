package filter_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// statuses records what the filter tells the health tracker.
type statuses struct {
	mu        sync.Mutex
	seen      map[string][]int
	addresses map[string][]string // the address each status came from
}

func (s *statuses) Observe(worker, address string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen, s.addresses = map[string][]int{}, map[string][]string{}
	}
	s.seen[worker] = append(s.seen[worker], status)
	s.addresses[worker] = append(s.addresses[worker], address)
}

func (s *statuses) addressesOf(worker string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addresses[worker]
}

func (s *statuses) of(worker string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[worker]
}

// A split request's status may be its prefill worker's, passed on by the decode
// worker's sidecar: a success counts for both workers, a failure for neither, so one
// broken prefill worker cannot take the decode workers out. The prefill header names
// the prefill worker to the destination; a client's own value is replaced.
func TestASplitRequestsStatusIsNotPinnedOnOneWorker(t *testing.T) {
	health := &statuses{}
	params := scoring.DefaultParams() // disaggregate_tokens 0: every request is split
	p := newPlane(t, planeOptions{workers: 2, roles: []string{router.RoleDecode, router.RolePrefill}, params: params, health: health})
	body := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + " " + strings.Repeat("a long question ", 20) + `"}]}`
	}
	resp, _ := p.post(t, "/v1/chat/completions", body("fine"), "x-prefiller-host-port", "10.9.9.9:80")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "w0", resp.Header.Get("x-served-by"), "a prefill worker is never the destination")
	served := p.workers[0].Served()
	require.Len(t, served, 1)
	assert.Equal(t, p.workers[1].address(), served[0].Header.Get("x-prefiller-host-port"), "kvroute's prefill worker, not the client's")
	assert.Equal(t, []int{200}, health.of("w0"))
	assert.Equal(t, []int{200}, health.of("w1"))
	assert.Equal(t, []string{p.workers[0].address()}, health.addressesOf("w0"), "each status names the address the request went to")
	assert.Equal(t, []string{p.workers[1].address()}, health.addressesOf("w1"))

	resp, _ = p.post(t, "/v1/chat/completions", body("FAIL_UPSTREAM"))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, []int{200}, health.of("w0"), "a failed split request counts against neither worker")
	assert.Equal(t, []int{200}, health.of("w1"))
	p.waitIdle(t)
}

// A model only prefill workers serve cannot be routed (a prefill worker is never the
// destination): the client gets a 503 that says so, not the generic "no worker is
// available" of a fleet that is momentarily out.
func TestAModelOnlyPrefillWorkersServeGetsAnErrorSayingSo(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, roles: []string{router.RolePrefill, router.RolePrefill}, params: scoring.DefaultParams()})
	resp, body := p.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, body, `"code":"no_decode_worker"`)
	assert.Contains(t, body, `"param":"model"`)
	assert.Contains(t, body, "only prefill workers serve this model")
	assert.Empty(t, p.workers[0].Served())
	assert.Empty(t, p.workers[1].Served())
}
