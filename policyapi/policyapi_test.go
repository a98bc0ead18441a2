package policyapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

func serve(t *testing.T, cfg Config) (*httptest.Server, *scoring.Policy, *prometheus.Registry) {
	t.Helper()
	if cfg.Policy == nil {
		p, err := scoring.NewPolicy(scoring.DefaultParams())
		require.NoError(t, err)
		cfg.Policy = p
	}
	reg := prometheus.NewRegistry()
	cfg.Metrics = NewMetrics(reg)
	h, err := Handler(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, cfg.Policy, reg
}

func do(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, out
}

func TestPolicyAPI(t *testing.T) {
	srv, policy, reg := serve(t, Config{})
	tests := []struct {
		name       string
		method     string
		body       string
		wantStatus int
		wantKey    string  // in the answer
		wantValue  float64 // of prefix_affinity_weight after the call
		wantError  string
	}{
		{"read", http.MethodGet, "", 200, "cache_pressure_weight", 4, ""},
		{"change one key", http.MethodPut, `{"prefix_affinity_weight": 2}`, 200, "overlap_credit", 2, ""},
		{"PATCH works too", http.MethodPatch, `{"prefix_affinity_weight": 3}`, 200, "overlap_credit", 3, ""},
		{"invalid value names the key", http.MethodPut, `{"prefix_affinity_weight": -1}`, 400, "error", 3, "policy.prefix_affinity_weight: must be finite and ≥ 0"},
		{"unknown key", http.MethodPut, `{"alpha": 1}`, 400, "error", 3, `unknown field "alpha"`},
		{"not JSON", http.MethodPut, `alpha=1`, 400, "error", 3, "not a JSON object"},
		{"null names no key: not an update", http.MethodPut, `null`, 400, "error", 3, "not a JSON object"},
		{"body too large", http.MethodPut, `{"temperature": 0` + strings.Repeat(" ", maxBody) + `}`, 413, "error", 3, "body over"},
		{"other methods", http.MethodDelete, "", 405, "error", 3, "GET reads the policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := do(t, tt.method, srv.URL, tt.body)
			assert.Equal(t, tt.wantStatus, status)
			assert.Contains(t, body, tt.wantKey)
			if tt.wantError != "" {
				assert.Contains(t, body["error"], tt.wantError)
			}
			assert.Equal(t, tt.wantValue, policy.Params().PrefixAffinityWeight)
		})
	}
	assert.Equal(t, 2.0, updates(t, reg, "applied"))
	assert.Equal(t, 5.0, updates(t, reg, "rejected"), "the 405 is not an update attempt")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestReadOnlyPolicyRefusesUpdates(t *testing.T) {
	srv, policy, _ := serve(t, Config{ReadOnly: "policy.picker is round_robin"})
	status, body := do(t, http.MethodPut, srv.URL, `{"prefix_affinity_weight": 2}`)
	assert.Equal(t, http.StatusConflict, status)
	assert.Equal(t, "policy.picker is round_robin", body["error"])
	assert.Equal(t, 4.0, policy.Params().PrefixAffinityWeight)
	status, _ = do(t, http.MethodGet, srv.URL, "")
	assert.Equal(t, http.StatusOK, status, "reading still works")
}

func TestHandlerNeedsAPolicy(t *testing.T) {
	_, err := Handler(Config{})
	assert.Error(t, err)
}

// updates reads kvroute_policy_updates_total{result}.
func updates(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "kvroute_policy_updates_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestASlowBodyIsCutOff: a client that sends an update's headers and then trickles
// (or stops sending) its body gets a 400 once BodyTimeout passes, instead of holding
// the connection and its goroutine for good.
func TestASlowBodyIsCutOff(t *testing.T) {
	srv, policy, reg := serve(t, Config{BodyTimeout: 50 * time.Millisecond})
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	// A safety net for a broken fix, not a measured limit.
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = fmt.Fprintf(conn, "PUT /policy HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"prefix_affinity_weight\"")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the server answered without the rest of the body")
	defer resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, scoring.DefaultParams().PrefixAffinityWeight, policy.Params().PrefixAffinityWeight)
	assert.Equal(t, 1.0, updates(t, reg, "rejected"))
}

// TestAnUpdateIsOneObjectAndNothingAfterIt: a body is one JSON object of policy keys
// and nothing else. What follows the object, whatever its first character, is a 400
// that changes nothing: a second object's keys are not quietly dropped while the
// first one's apply (the update half applied, and answered 200).
func TestAnUpdateIsOneObjectAndNothingAfterIt(t *testing.T) {
	srv, policy, reg := serve(t, Config{})
	before := policy.Params()
	tests := []struct {
		name string
		body string
	}{
		{"a second object", `{"prefix_affinity_weight": 2} {"temperature": 1}`},
		{"a stray closing brace", `{"prefix_affinity_weight": 2}}`},
		{"a stray closing bracket", `{"prefix_affinity_weight": 2}]`},
		{"a second object after a stray brace", `{"prefix_affinity_weight": 2}}{"temperature": 1}`},
		{"a second object after a stray bracket", `{"prefix_affinity_weight": 2}] {"temperature": 1}`},
		{"a word", `{"prefix_affinity_weight": 2} garbage`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := do(t, http.MethodPut, srv.URL, tt.body)
			assert.Equal(t, http.StatusBadRequest, status, body)
			assert.Contains(t, body["error"], "trailing data")
			assert.Equal(t, before, policy.Params(), "nothing changed")
		})
	}
	assert.Zero(t, updates(t, reg, "applied"))
	assert.Equal(t, float64(len(tests)), updates(t, reg, "rejected"))
	// White space after the object is not data.
	status, body := do(t, http.MethodPut, srv.URL, "{\"prefix_affinity_weight\": 2}\r\n\t ")
	assert.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, 2.0, policy.Params().PrefixAffinityWeight)
}
