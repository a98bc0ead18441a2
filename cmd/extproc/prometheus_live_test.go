package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// A real Prometheus (Debian's prometheus package, as promtool) scrapes a running
// kvroute that has routed requests, loads examples/prometheus-rules.yaml, and is asked
// every query of the dashboard. What a parse cannot tell shows here: a query that fails
// on kvroute's real series (many-to-many matching, a label set that does not join), a
// rule whose evaluation errs, an alert that fires on a healthy fleet, or a series the
// scrape does not take.
func TestARealPrometheusScrapesKvrouteAndRunsTheRulesAndDashboard(t *testing.T) {
	binary := prometheusTool(t, "prometheus")
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil)
	defer d.stop()
	for i := range 6 {
		_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(strings.Repeat("You route requests. ", 20)), openai.UserMessage(fmt.Sprintf("question %d", i))}})
		require.NoError(t, err)
	}

	prom := startPrometheus(t, binary, strings.TrimPrefix(d.adminURL, "http://"))
	// Three scrapes of the target (a rate needs two samples), then the rules evaluated
	// after them.
	waitUntil(t, "Prometheus scraped kvroute three times", func() bool {
		r := prom.query(t, `count_over_time(up{job="kvroute"}[1m])`)
		return len(r) == 1 && r[0].Value >= 3
	})
	scraped := time.Now()
	up := prom.query(t, `up{job="kvroute"}`)
	require.Len(t, up, 1)
	assert.Equal(t, 1.0, up[0].Value, "kvroute's target is up")
	waitUntil(t, "the rules were evaluated on the scraped series", func() bool { return prom.rulesEvaluatedAfter(t, scraped) })

	// Every rule evaluates without error, and none fires on this healthy deployment
	// (rules with a `for` cannot fire within seconds; the others must not either).
	rules := prom.rules(t)
	require.Len(t, rules, len(readAlertRules(t)))
	for _, r := range rules {
		assert.Equal(t, "ok", r.Health, "rule %s: %s", r.Name, r.LastError)
		assert.NotEqual(t, "firing", r.State, "rule %s fires on a healthy deployment", r.Name)
	}

	// Every dashboard query runs on the real series; the panels of the requests routed
	// show them.
	exprs := dashboardExprs(t, "../../examples/grafana/kvroute.json")
	for _, expr := range slices.Sorted(maps.Keys(exprs)) {
		prom.query(t, strings.ReplaceAll(expr, "$__rate_interval", "1m"))
	}
	for _, series := range []string{"kvroute_filter_requests_total", "kvroute_filter_completions_total",
		"kvroute_filter_decision_duration_seconds_bucket", "kvroute_filter_predicted_cache_hit_ratio_count",
		"kvroute_scoring_active_requests", "kvroute_worker_eligible", "kvroute_index_entries"} {
		assert.NotEmpty(t, prom.query(t, series), "Prometheus took %s from the scrape", series)
	}
	routed := prom.query(t, `sum(kvroute_filter_requests_total{outcome="routed"})`)
	require.Len(t, routed, 1)
	assert.Equal(t, 6.0, routed[0].Value, "the six routed requests, as Prometheus read them")
}

// waitUntil polls cond on the test's goroutine (cond may fail the test, which
// require.Eventually's goroutine may not) every 200 ms for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30 s: %s", what)
		}
	}
}

// liveProm is a Prometheus server a test started on loopback.
type liveProm struct{ url string }

// startPrometheus runs binary scraping target's /metrics each second, with the
// example rules evaluated each second, and stops it when the test ends.
func startPrometheus(t *testing.T, binary, target string) liveProm {
	t.Helper()
	dir := t.TempDir()
	rulesPath, err := filepath.Abs(rulesFile)
	require.NoError(t, err)
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rulesPath},
		"scrape_configs": []map[string]any{{
			"job_name": "kvroute", "metrics_path": "/metrics",
			"static_configs": []map[string]any{{"targets": []string{target}}},
		}},
	}
	raw, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	cfgPath := filepath.Join(dir, "prometheus.yaml")
	require.NoError(t, os.WriteFile(cfgPath, raw, 0o644))
	// A free loopback port for its web listener (Prometheus does not report a port 0).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	cmd := exec.Command(binary, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logs := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus logs:\n%s", logs.String())
		}
	})
	p := liveProm{url: "http://" + addr}
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "Prometheus is ready")
	select {
	case <-exited:
		t.Fatalf("prometheus exited:\n%s", logs.String())
	default:
	}
	return p
}

// promSample is one series of an instant query's vector: its labels and value.
type promSample struct {
	Metric map[string]string
	Value  float64
}

// query runs expr as an instant query and returns its vector (a scalar as one sample);
// Prometheus's error fails the test.
func (p liveProm) query(t *testing.T, expr string) []promSample {
	t.Helper()
	var resp struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(expr), &resp)
	require.Equal(t, "success", resp.Status, "query %s: %s", expr, resp.Error)
	// A sample is [unix time, "value"].
	type sample struct {
		Metric map[string]string  `json:"metric"`
		Value  [2]json.RawMessage `json:"value"`
	}
	var samples []sample
	switch resp.Data.ResultType {
	case "vector":
		require.NoError(t, json.Unmarshal(resp.Data.Result, &samples))
	case "scalar":
		var v [2]json.RawMessage
		require.NoError(t, json.Unmarshal(resp.Data.Result, &v))
		samples = []sample{{Value: v}}
	default:
		t.Fatalf("query %s: result type %s", expr, resp.Data.ResultType)
	}
	out := make([]promSample, len(samples))
	for i, s := range samples {
		var text string
		require.NoError(t, json.Unmarshal(s.Value[1], &text), "query %s", expr)
		v, err := strconv.ParseFloat(text, 64)
		require.NoError(t, err, "query %s", expr)
		out[i] = promSample{Metric: s.Metric, Value: v}
	}
	return out
}

// promRule is one rule of /api/v1/rules.
type promRule struct {
	Name           string    `json:"name"`
	State          string    `json:"state"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

func (p liveProm) rules(t *testing.T) []promRule {
	t.Helper()
	var resp struct {
		Status string `json:"status"`
		Data   struct {
			Groups []struct {
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	p.get(t, "/api/v1/rules", &resp)
	require.Equal(t, "success", resp.Status)
	var rules []promRule
	for _, g := range resp.Data.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// rulesEvaluatedAfter reports whether every rule was last evaluated after since.
func (p liveProm) rulesEvaluatedAfter(t *testing.T, since time.Time) bool {
	t.Helper()
	rules := p.rules(t)
	for _, r := range rules {
		if !r.LastEvaluation.After(since) {
			return false
		}
	}
	return len(rules) > 0
}

func (p liveProm) get(t *testing.T, path string, into any) {
	t.Helper()
	resp, err := http.Get(p.url + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(body, into), "%s: %s", path, body)
}
