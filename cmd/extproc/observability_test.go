package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// exportedNames are the metric names of the registry build wires: every series
// kvroute can export, whether or not it has a sample yet.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for name := range exportedLabels(t) {
		names[name] = true
	}
	return names
}

// exportedLabels maps each metric name of the registry build wires to its label
// names (a histogram's own, without le), sorted.
func exportedLabels(t *testing.T) map[string][]string {
	t.Helper()
	cfg := config.Default()
	cfg.Router.Workers = []router.Worker{{Name: "w", Address: "127.0.0.1:1"}}
	a, err := build(cfg, nil, discardLogger())
	require.NoError(t, err)
	descs := make(chan *prometheus.Desc)
	go func() { a.registry.Describe(descs); close(descs) }()
	desc := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	labels := map[string][]string{}
	for d := range descs {
		m := desc.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		var names []string
		if m[2] != "" {
			names = strings.Split(m[2], ",")
		}
		slices.Sort(names)
		labels[m[1]] = names
	}
	return labels
}

// promQL words that are not metric names: functions, aggregations and keywords.
var promQLWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "rate": true, "irate": true, "increase": true,
	"histogram_quantile": true, "by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "and": true, "or": true, "unless": true, "offset": true, "bool": true, "clamp_min": true,
	"topk": true, "bottomk": true, "abs": true, "delta": true, "deriv": true,
}

var (
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers   = regexp.MustCompile(`\{[^}]*\}`)
	ranges     = regexp.MustCompile(`\[[^\]]*\]`)
	groupings  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	number     = regexp.MustCompile(`^[0-9.]+$`)
)

// metricNames returns the metric names a PromQL expression reads: what is left once
// strings, label matchers, ranges, groupings, functions and keywords are removed.
func metricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{quoted, matchers, ranges, groupings} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, loc := range identifier.FindAllStringIndex(expr, -1) {
		word := expr[loc[0]:loc[1]]
		if promQLWords[word] || number.MatchString(word) || strings.HasPrefix(strings.TrimSpace(expr[loc[1]:]), "(") {
			continue
		}
		names = append(names, word)
	}
	return names
}

func TestMetricNamesOfPromQL(t *testing.T) {
	assert.Equal(t, []string{"a_bucket"}, metricNames(`histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{x="y z"}[$__rate_interval])))`))
	assert.Equal(t, []string{"a", "b"}, metricNames(`sum(rate(a[5m])) / sum(rate(b{outcome="routed"}[5m]))`))
	assert.Equal(t, []string{"g"}, metricNames(`max by (worker, source) (g)`))
}

// dashboardExprs returns every query of a Grafana dashboard, row panels included.
func dashboardExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	require.NoError(t, dec.Decode(&dash))
	exprs := map[string]string{}
	var walk func([]json.RawMessage)
	walk = func(raws []json.RawMessage) {
		for _, r := range raws {
			var p panel
			require.NoError(t, json.Unmarshal(r, &p))
			for _, target := range p.Targets {
				exprs[target.Expr] = p.Title
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	return exprs
}

// Every series the dashboard queries is one kvroute exports, and the dashboard covers
// what operators need to see.
func TestGrafanaDashboardQueriesKvroutesSeries(t *testing.T) {
	exported := exportedNames(t)
	exprs := dashboardExprs(t, "../../examples/grafana/kvroute.json")
	require.NotEmpty(t, exprs)
	used := map[string]bool{}
	for expr, title := range exprs {
		names := metricNames(expr)
		assert.NotEmpty(t, names, "panel %q: %s reads no series", title, expr)
		for _, name := range names {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] {
					base = b
				}
			}
			assert.True(t, exported[base], "panel %q queries %s, which kvroute does not export", title, name)
			used[base] = true
		}
	}
	for _, need := range []string{
		"kvroute_filter_requests_total", "kvroute_filter_completions_total", // decisions and outcomes
		"kvroute_filter_decision_duration_seconds",                                                // latency by stage
		"kvroute_filter_predicted_cache_hit_ratio", "kvroute_filter_reported_cached_tokens_total", // predicted vs reported
		"kvroute_scoring_prefill_tokens", "kvroute_scoring_active_blocks", "kvroute_scoring_active_requests", // P, D, N
		"kvroute_non_max_overlap_selections_total", "kvroute_index_entries", "kvroute_worker_eligible",
		"kvroute_worker_capacity_blocks", "kvroute_discovery_workers",
	} {
		assert.True(t, used[need], "the dashboard shows %s", need)
	}
	var unused []string
	for name := range exported {
		if strings.HasPrefix(name, "kvroute_") && !used[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	assert.Empty(t, unused, "kvroute series no panel of examples/grafana/kvroute.json shows: add them there")
}

func TestPrometheusExampleScrapesKvrouteAndVLLM(t *testing.T) {
	raw, err := os.ReadFile("../../examples/prometheus.yaml")
	require.NoError(t, err)
	var cfg struct {
		Global struct {
			ScrapeInterval     string `yaml:"scrape_interval"`
			EvaluationInterval string `yaml:"evaluation_interval"`
		} `yaml:"global"`
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName             string `yaml:"job_name"`
			MetricsPath         string `yaml:"metrics_path"`
			KubernetesSDConfigs []struct {
				Role       string `yaml:"role"`
				Namespaces struct {
					Names []string `yaml:"names"`
				} `yaml:"namespaces"`
			} `yaml:"kubernetes_sd_configs"`
			RelabelConfigs []struct {
				SourceLabels []string `yaml:"source_labels"`
				Regex        string   `yaml:"regex"`
				Action       string   `yaml:"action"`
				TargetLabel  string   `yaml:"target_label"`
			} `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&cfg))

	ex := loadExample(t)
	// What each job must keep: the pods' app label and the port serving /metrics.
	want := map[string][2]string{}
	for _, d := range ex.deployments {
		c := container(t, d)
		port := "http"
		if containerPort(c, "metrics") != 0 {
			port = "metrics"
		}
		want[d.Spec.Template.Labels["app"]] = [2]string{port, d.Namespace}
	}
	require.Len(t, cfg.ScrapeConfigs, 2)
	for _, job := range cfg.ScrapeConfigs {
		assert.Equal(t, "/metrics", job.MetricsPath)
		require.Len(t, job.KubernetesSDConfigs, 1)
		assert.Equal(t, "pod", job.KubernetesSDConfigs[0].Role)
		keep := map[string]string{}
		for _, r := range job.RelabelConfigs {
			if r.Action == "keep" {
				keep[strings.Join(r.SourceLabels, ",")] = r.Regex
			}
		}
		app := keep["__meta_kubernetes_pod_label_app"]
		target, ok := want[app]
		require.True(t, ok, "job %s keeps pods of app %q, which no example Deployment has", job.JobName, app)
		assert.Equal(t, target[0], keep["__meta_kubernetes_pod_container_port_name"], "job %s scrapes the port serving /metrics", job.JobName)
		assert.Equal(t, []string{target[1]}, job.KubernetesSDConfigs[0].Namespaces.Names)
		delete(want, app)
	}
	assert.Empty(t, want, "every Deployment of the example is scraped")
	assert.Equal(t, []string{"prometheus-rules.yaml"}, cfg.RuleFiles, "kvroute's alerts are loaded")
}

// TestPrometheusRulesAlertOnKvroutesSeries: examples/prometheus-rules.yaml is a
// Prometheus rule file whose every alert is complete (an expression, a severity, a
// summary and a description; a duration Prometheus reads), reads only series kvroute
// exports (or Prometheus's up), and covers every kvroute series the README's "Alerts"
// checklist names.
func TestPrometheusRulesAlertOnKvroutesSeries(t *testing.T) {
	raw, err := os.ReadFile("../../examples/prometheus-rules.yaml")
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&file))
	require.Len(t, file.Groups, 1)

	exported := exportedNames(t)
	alerted := map[string]bool{}
	names := map[string]bool{}
	for _, rule := range file.Groups[0].Rules {
		assert.Regexp(t, `^Kvroute[A-Z][A-Za-z]+$`, rule.Alert)
		assert.False(t, names[rule.Alert], "alert %s is defined twice", rule.Alert)
		names[rule.Alert] = true
		assert.Contains(t, []string{"critical", "warning", "info"}, rule.Labels["severity"], rule.Alert)
		assert.NotEmpty(t, rule.Annotations["summary"], rule.Alert)
		assert.NotEmpty(t, rule.Annotations["description"], rule.Alert)
		if rule.For != "" {
			_, err := time.ParseDuration(rule.For)
			assert.NoError(t, err, "%s: for", rule.Alert)
		}
		assert.True(t, balanced(rule.Expr), "%s: unbalanced brackets in %s", rule.Alert, rule.Expr)
		series := metricNames(rule.Expr)
		assert.NotEmpty(t, series, "%s reads no series", rule.Alert)
		for _, name := range series {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] {
					base = b
				}
			}
			assert.True(t, name == "up" || exported[base], "%s reads %s, which kvroute does not export", rule.Alert, name)
			alerted[base] = true
		}
	}

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, checklist, found := strings.Cut(string(readme), "**Alerts**")
	require.True(t, found, "the README's Alerts checklist")
	checklist, _, _ = strings.Cut(checklist, "\n**")
	for _, name := range regexp.MustCompile(`kvroute_[a-z_]+`).FindAllString(checklist, -1) {
		if exported[name] {
			assert.True(t, alerted[name], "the README's Alerts checklist names %s, which no rule of examples/prometheus-rules.yaml reads", name)
		}
	}
}

// balanced reports whether expr's brackets pair up, quoted strings aside.
func balanced(expr string) bool {
	expr = quoted.ReplaceAllString(expr, `""`)
	var open []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range expr {
		switch r {
		case '(', '[', '{':
			open = append(open, r)
		case ')', ']', '}':
			if len(open) == 0 || open[len(open)-1] != pairs[r] {
				return false
			}
			open = open[:len(open)-1]
		}
	}
	return len(open) == 0
}

// The background loops build wires count their panics on the registry, each loop's
// series from 0 (an alert on any increase then sees the first panic).
func TestBackgroundLoopsCountTheirPanicsFromZero(t *testing.T) {
	for _, tc := range []struct {
		name        string
		flowControl bool
		want        map[string]float64
	}{
		{"the static workers' probes, scrapes and model lists (no KV events, peers or discovery source configured)",
			false, map[string]float64{"health": 0, "scrape": 0, "models": 0}},
		{"and flow control's questions to the router when it is on",
			true, map[string]float64{"health": 0, "scrape": 0, "models": 0, "flow_control": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Router.Workers = []router.Worker{{Name: "w", Address: "127.0.0.1:1"}}
			cfg.FlowControl.Enabled = tc.flowControl
			a, err := build(cfg, nil, discardLogger())
			require.NoError(t, err)
			families, err := a.registry.Gather()
			require.NoError(t, err)
			loops := map[string]float64{}
			for _, f := range families {
				if f.GetName() == "kvroute_background_panics_total" {
					for _, m := range f.GetMetric() {
						loops[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
			assert.Equal(t, tc.want, loops)
		})
	}
}

// The README's Metrics table names every series kvroute exports, so an operator reading
// it finds each one the dashboard and the alerts use.
func TestREADMEMetricsTableListsEverySeries(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, table, found := strings.Cut(string(readme), "### Metrics (admin port `/metrics`)")
	require.True(t, found, "the README's Metrics section")
	table, _, _ = strings.Cut(table, "\n## ")
	listed := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `kvroute_") {
			continue
		}
		series, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		for _, name := range regexp.MustCompile("`(kvroute_[a-z_]+)").FindAllStringSubmatch(series, -1) {
			listed[name[1]] = true
		}
	}
	var missing []string
	for name := range exportedNames(t) {
		if strings.HasPrefix(name, "kvroute_") && !listed[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	assert.Empty(t, missing, "kvroute series the README's Metrics table has no row for")
}
