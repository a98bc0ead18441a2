package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// These tests hand the example alert rules and the dashboard's queries to Prometheus's
// own promtool: its PromQL parser, its rule checker and its rule unit tester, so that
// an expression that parses here but not in Prometheus, an alert that never fires (or
// fires on a healthy fleet), or a summary naming a label its expression dropped fails
// CI. .ci/run installs promtool (Debian's prometheus package) and sets
// KVROUTE_REQUIRE_PROMTOOL=1; elsewhere they skip without it.

const rulesFile = "../../examples/prometheus-rules.yaml"

// prometheusTool returns the path of name, a binary of Debian's prometheus package, or
// skips the test when it is not on PATH (fails it when KVROUTE_REQUIRE_PROMTOOL is set,
// as in CI).
func prometheusTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("KVROUTE_REQUIRE_PROMTOOL") != "" {
			t.Fatalf("KVROUTE_REQUIRE_PROMTOOL is set but %s is not on PATH: %v", name, err)
		}
		t.Skipf("%s is not on PATH (Debian: apt-get install prometheus)", name)
	}
	return path
}

// runPromtool runs promtool with args and fails the test with its output if it fails.
func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(prometheusTool(t, "promtool"), args...).CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
}

// alertRule is one rule of examples/prometheus-rules.yaml, as the tests read it.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readAlertRules(t *testing.T) map[string]alertRule {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &file))
	rules := map[string]alertRule{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
		}
	}
	return rules
}

func TestPrometheusRulesPassPromtoolsCheck(t *testing.T) {
	runPromtool(t, "check", "rules", rulesFile)
}

// Every query of the dashboard is PromQL Prometheus parses: each is checked as a
// recording rule, with Grafana's $__rate_interval given a value.
func TestGrafanaDashboardQueriesParseAsPromQL(t *testing.T) {
	exprs := dashboardExprs(t, "../../examples/grafana/kvroute.json")
	require.NotEmpty(t, exprs)
	sorted := slices.Sorted(maps.Keys(exprs))
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, expr := range sorted {
		expr = strings.ReplaceAll(expr, "$__rate_interval", "1m")
		assert.NotContains(t, expr, "$", "panel %q: a dashboard variable this test does not substitute", exprs[sorted[i]])
		rules = append(rules, rule{Record: fmt.Sprintf("kvroute_dashboard:query_%d", i), Expr: expr})
	}
	file := map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}}
	raw, err := yaml.Marshal(file)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	runPromtool(t, "check", "rules", path)
}

// alertCase is one unit test of an alert: series with their samples (promtool's
// expanding notation, a sample a minute), and the alerts firing at one time.
type alertCase struct {
	name   string            // the behaviour pinned
	alert  string            // the rule's name
	series map[string]string // series → samples
	at     string            // evaluation time
	fires  []firing          // none: the alert is not firing at `at`
}

// firing is one firing alert: its labels besides alertname and the rule's own, and its
// rendered summary (the description has no template and is taken from the rule).
type firing struct {
	labels  map[string]string
	summary string
}

// The kvroute replica the cases' series come from.
const (
	inst = `instance="kvroute-0:9090",job="kvroute"`
	host = "kvroute-0:9090"
)

var alertCases = []alertCase{
	{
		name: "a replica not scraped for a minute", alert: "KvrouteDown",
		series: map[string]string{`up{` + inst + `}`: "0x10"},
		at:     "5m",
		fires:  []firing{{map[string]string{"instance": host, "job": "kvroute"}, "kvroute kvroute-0:9090 is not scraped"}},
	},
	{
		name: "a replica scraped", alert: "KvrouteDown",
		series: map[string]string{`up{` + inst + `}`: "1x10"},
		at:     "5m",
	},
	{
		name: "a stream panicked in the last 10 minutes", alert: "KvrouteStreamPanicked",
		series: map[string]string{`kvroute_server_panics_total{` + inst + `,method="/envoy.service.ext_proc.v3.ExternalProcessor/Process"}`: "0 0 1x10"},
		at:     "5m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "method": "/envoy.service.ext_proc.v3.ExternalProcessor/Process"},
			"kvroute kvroute-0:9090 recovered a panic in /envoy.service.ext_proc.v3.ExternalProcessor/Process"}},
	},
	{
		name: "a panic 20 minutes ago is over", alert: "KvrouteStreamPanicked",
		series: map[string]string{`kvroute_server_panics_total{` + inst + `,method="/envoy.service.ext_proc.v3.ExternalProcessor/Process"}`: "0 1x30"},
		at:     "25m",
	},
	{
		name: "a background loop panicked", alert: "KvrouteBackgroundLoopPanicked",
		series: map[string]string{
			`kvroute_background_panics_total{` + inst + `,loop="scrape"}`: "0 0 1x10",
			`kvroute_background_panics_total{` + inst + `,loop="health"}`: "0x12",
		},
		at:    "5m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "loop": "scrape"}, "kvroute kvroute-0:9090 recovered a panic in its scrape loop"}},
	},
	{
		name: "a worker out for 5 minutes, not its healthy neighbour", alert: "KvrouteWorkerOut",
		series: map[string]string{
			`kvroute_worker_eligible{` + inst + `,worker="w0"}`: "1x10",
			`kvroute_worker_eligible{` + inst + `,worker="w1"}`: "0x10",
		},
		at:    "6m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "worker": "w1"}, "worker w1 has been out for a health back-off for 5 minutes"}},
	},
	{
		name: "a worker out for 3 minutes is pending", alert: "KvrouteWorkerOut",
		series: map[string]string{`kvroute_worker_eligible{` + inst + `,worker="w1"}`: "1x3 0x10"},
		at:     "6m",
	},
	{
		name: "probes failing for 10 minutes; 5xx answers are not probes", alert: "KvrouteWorkerProbesFailing",
		series: map[string]string{
			`kvroute_worker_health_failures_total{` + inst + `,worker="w1",source="probe"}`:    "0+1x30",
			`kvroute_worker_health_failures_total{` + inst + `,worker="w0",source="response"}`: "0+5x30",
		},
		at:    "20m",
		fires: []firing{{map[string]string{"instance": host, "worker": "w1"}, "health probes of w1 keep failing"}},
	},
	{
		name: "requests routed with every candidate out", alert: "KvrouteEveryWorkerOut",
		series: map[string]string{`kvroute_filter_routed_all_out_total{` + inst + `}`: "0 0 3x10"},
		at:     "3m",
		fires:  []firing{{map[string]string{"instance": host, "job": "kvroute"}, "kvroute kvroute-0:9090 routed requests with every candidate out"}},
	},
	{
		name: "requests routed with every candidate out 15 minutes ago", alert: "KvrouteEveryWorkerOut",
		series: map[string]string{`kvroute_filter_routed_all_out_total{` + inst + `}`: "0 3x20"},
		at:     "15m",
	},
	{
		// 10 decisions a minute, all between 10 and 100 ms for tokenize: its p99 is
		// about 99 ms; parse's, all under 10 ms, about 9.9 ms.
		name: "the tokenize stage's p99 over 50 ms, not parse's", alert: "KvrouteDecisionStageSlow",
		series: map[string]string{
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="tokenize",le="0.01"}`: "0x30",
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="tokenize",le="0.1"}`:  "0+10x30",
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="tokenize",le="+Inf"}`: "0+10x30",
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="parse",le="0.01"}`:    "0+10x30",
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="parse",le="0.1"}`:     "0+10x30",
			`kvroute_filter_decision_duration_seconds_bucket{` + inst + `,stage="parse",le="+Inf"}`:    "0+10x30",
		},
		at:    "20m",
		fires: []firing{{map[string]string{"instance": host, "stage": "tokenize"}, "the tokenize stage of kvroute kvroute-0:9090's decisions takes over 50 ms at p99"}},
	},
	{
		name: "a tenth of a worker's completions are engine errors; 1 % of another's are not", alert: "KvrouteUpstreamErrors",
		series: map[string]string{
			`kvroute_filter_completions_total{` + inst + `,worker="w1",outcome="upstream_error"}`: "0+1x30",
			`kvroute_filter_completions_total{` + inst + `,worker="w1",outcome="success"}`:        "0+9x30",
			`kvroute_filter_completions_total{` + inst + `,worker="w0",outcome="upstream_error"}`: "0+1x30",
			`kvroute_filter_completions_total{` + inst + `,worker="w0",outcome="success"}`:        "0+99x30",
		},
		at:    "15m",
		fires: []firing{{map[string]string{"instance": host, "worker": "w1"}, "over 5 % of the requests sent to w1 end in an engine error"}},
	},
	{
		name: "2 % of requests refused with 429", alert: "KvrouteShedding",
		series: map[string]string{
			`kvroute_filter_requests_total{` + inst + `,outcome="rate_limit_exceeded"}`: "0+1x30",
			`kvroute_filter_requests_total{` + inst + `,outcome="routed"}`:              "0+49x30",
		},
		at:    "20m",
		fires: []firing{{map[string]string{"instance": host}, "kvroute kvroute-0:9090 refuses over 1 % of requests with 429"}},
	},
	{
		name: "half a percent refused is under the bar", alert: "KvrouteShedding",
		series: map[string]string{
			`kvroute_filter_requests_total{` + inst + `,outcome="rate_limit_exceeded"}`: "0+1x30",
			`kvroute_filter_requests_total{` + inst + `,outcome="routed"}`:              "0+199x30",
		},
		at: "20m",
	},
	{
		name: "held requests timing out, not dispatched ones", alert: "KvrouteFlowControlGivingUp",
		series: map[string]string{
			`kvroute_flow_control_requests_total{` + inst + `,outcome="timed_out"}`:  "0+1x30",
			`kvroute_flow_control_requests_total{` + inst + `,outcome="dispatched"}`: "0+100x30",
		},
		at:    "20m",
		fires: []firing{{map[string]string{"instance": host, "outcome": "timed_out"}, "flow control on kvroute-0:9090 answers held requests with 429 (timed_out)"}},
	},
	{
		name: "bookings held with no request for 25 minutes", alert: "KvrouteBookingLeak",
		series: map[string]string{
			`kvroute_scoring_active_requests{` + inst + `,worker="w0"}`:    "2x40",
			`kvroute_scoring_active_requests{` + inst + `,worker="w1"}`:    "0x40",
			`kvroute_filter_requests_total{` + inst + `,outcome="routed"}`: "100x40",
		},
		at:    "35m",
		fires: []firing{{map[string]string{"instance": host}, "kvroute kvroute-0:9090 holds booked requests with no traffic"}},
	},
	{
		name: "bookings with traffic are no leak", alert: "KvrouteBookingLeak",
		series: map[string]string{
			`kvroute_scoring_active_requests{` + inst + `,worker="w0"}`:    "2x40",
			`kvroute_filter_requests_total{` + inst + `,outcome="routed"}`: "0+10x40",
		},
		at: "35m",
	},
	{
		name: "streams broken at a rate over 0.1/s", alert: "KvrouteStreamErrors",
		series: map[string]string{`kvroute_filter_stream_errors_total{` + inst + `,reason="recv"}`: "0+60x30"},
		at:     "20m",
		fires:  []firing{{map[string]string{"instance": host, "reason": "recv"}, "ext_proc streams to kvroute kvroute-0:9090 end abnormally (recv)"}},
	},
	{
		name: "a broken stream every 20 s is under the bar", alert: "KvrouteStreamErrors",
		series: map[string]string{`kvroute_filter_stream_errors_total{` + inst + `,reason="recv"}`: "0+3x30"},
		at:     "20m",
	},
	{
		name: "two malformed requests a second", alert: "KvrouteHostileInput",
		series: map[string]string{`kvroute_filter_requests_total{` + inst + `,outcome="invalid_request"}`: "0+120x30"},
		at:     "20m",
		fires:  []firing{{map[string]string{"instance": host, "outcome": "invalid_request"}, "kvroute kvroute-0:9090 refuses malformed or oversized requests (invalid_request)"}},
	},
	{
		name: "an oversized request every 2 s is under the bar", alert: "KvrouteHostileInput",
		series: map[string]string{`kvroute_filter_requests_total{` + inst + `,outcome="request_too_large"}`: "0+30x30"},
		at:     "20m",
	},
	{
		name: "prompts cut at max_prompt_tokens", alert: "KvroutePromptsNotRead",
		series: map[string]string{`kvroute_router_prompts_cut_total{` + inst + `}`: "0+1x40"},
		at:     "20m",
		fires:  []firing{{map[string]string{"instance": host}, "kvroute kvroute-0:9090 routes some prompts by load alone, cuts them, or rejects engines' usage"}},
	},
	{
		name: "prompts failing to encode", alert: "KvroutePromptsNotRead",
		series: map[string]string{`kvroute_router_prompt_fallbacks_total{` + inst + `,reason="error"}`: "0+1x40"},
		at:     "20m",
		fires:  []firing{{map[string]string{"instance": host}, "kvroute kvroute-0:9090 routes some prompts by load alone, cuts them, or rejects engines' usage"}},
	},
	{
		name: "media parts routed by load are expected", alert: "KvroutePromptsNotRead",
		series: map[string]string{`kvroute_router_prompt_fallbacks_total{` + inst + `,reason="unsupported_content"}`: "0+10x40"},
		at:     "20m",
	},
	{
		// Engines report 10 % of prompt tokens cached where kvroute predicted 80 %.
		name: "engines serve under half the predicted hits for an hour", alert: "KvroutePredictionsMissCache",
		series: map[string]string{
			`kvroute_filter_reported_cached_tokens_total{` + inst + `}`:    "0+10x120",
			`kvroute_filter_reported_prompt_tokens_total{` + inst + `}`:    "0+100x120",
			`kvroute_filter_predicted_cache_hit_ratio_sum{` + inst + `}`:   "0+8x120",
			`kvroute_filter_predicted_cache_hit_ratio_count{` + inst + `}`: "0+10x120",
		},
		at:    "100m",
		fires: []firing{{map[string]string{"instance": host}, "engines behind kvroute kvroute-0:9090 serve under half the cache hits it predicts"}},
	},
	{
		name: "engines serving 60 % of a predicted 80 %", alert: "KvroutePredictionsMissCache",
		series: map[string]string{
			`kvroute_filter_reported_cached_tokens_total{` + inst + `}`:    "0+60x120",
			`kvroute_filter_reported_prompt_tokens_total{` + inst + `}`:    "0+100x120",
			`kvroute_filter_predicted_cache_hit_ratio_sum{` + inst + `}`:   "0+8x120",
			`kvroute_filter_predicted_cache_hit_ratio_count{` + inst + `}`: "0+10x120",
		},
		at: "100m",
	},
	{
		name: "a worker's events silent for 5 minutes", alert: "KvrouteKVEventsSilent",
		series: map[string]string{
			`kvroute_kvevents_worker_mode{` + inst + `,worker="w1",mode="approximate"}`: "1x10",
			`kvroute_kvevents_worker_mode{` + inst + `,worker="w1",mode="events"}`:      "0x10",
			`kvroute_kvevents_worker_mode{` + inst + `,worker="w0",mode="approximate"}`: "0x10",
			`kvroute_kvevents_worker_mode{` + inst + `,worker="w0",mode="events"}`:      "1x10",
		},
		at: "6m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "worker": "w1", "mode": "approximate"},
			"worker w1's KV events stream has been silent or broken for 5 minutes"}},
	},
	{
		name: "discovery's input rejected for 5 minutes", alert: "KvrouteDiscoveryStale",
		series: map[string]string{`kvroute_discovery_stale{` + inst + `}`: "1x10"},
		at:     "6m",
		fires:  []firing{{map[string]string{"instance": host, "job": "kvroute"}, "kvroute kvroute-0:9090 rejects the workers its discovery source offers"}},
	},
	{
		name: "discovery's input rejected for 3 minutes, then taken", alert: "KvrouteDiscoveryStale",
		series: map[string]string{`kvroute_discovery_stale{` + inst + `}`: "1x3 0x10"},
		at:     "6m",
	},
	{
		name: "one of four model lists lost", alert: "KvrouteEngineModelListsLost",
		series: map[string]string{`kvroute_engine_models_known_lists{` + inst + `}`: "4x10 3x30"},
		at:     "30m",
		fires:  []firing{{map[string]string{"instance": host, "job": "kvroute"}, "kvroute kvroute-0:9090 reads fewer engines' model lists than it did"}},
	},
	{
		name: "model lists steady", alert: "KvrouteEngineModelListsLost",
		series: map[string]string{`kvroute_engine_models_known_lists{` + inst + `}`: "4x40"},
		at:     "30m",
	},
	{
		name: "requests for an unlisted model for 30 minutes", alert: "KvrouteModelUnlisted",
		series: map[string]string{`kvroute_filter_model_unlisted_total{` + inst + `}`: "0+1x60"},
		at:     "45m",
		fires:  []firing{{map[string]string{"instance": host}, "kvroute kvroute-0:9090 routes requests for a model no engine lists"}},
	},
	{
		name: "unlisted-model requests that stopped 20 minutes ago", alert: "KvrouteModelUnlisted",
		series: map[string]string{`kvroute_filter_model_unlisted_total{` + inst + `}`: "0+1x25 25x35"},
		at:     "45m",
	},
	{
		name: "a peer lost for 5 minutes", alert: "KvroutePeersLost",
		series: map[string]string{`kvroute_peers_live{` + inst + `}`: "2x10 1x30"},
		at:     "20m",
		fires:  []firing{{map[string]string{"instance": host, "job": "kvroute"}, "kvroute kvroute-0:9090 hears from fewer replicas than in the last hour"}},
	},
	{
		name: "a peer back after 3 minutes", alert: "KvroutePeersLost",
		series: map[string]string{`kvroute_peers_live{` + inst + `}`: "2x10 1x3 2x30"},
		at:     "20m",
	},
	{
		name: "renders refused with 401, not ones that timed out", alert: "KvrouteEngineRenderUnauthorized",
		series: map[string]string{
			`kvroute_engine_renders_total{` + inst + `,model="qwen3",outcome="unauthorized"}`: "0 0 3x10",
			`kvroute_engine_renders_total{` + inst + `,model="qwen3",outcome="timeout"}`:      "0 0 3x10",
		},
		at: "3m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "model": "qwen3", "outcome": "unauthorized"},
			"engines refuse kvroute's render calls for qwen3 (401 or 403)"}},
	},
	{
		name: "a worker's capacity defaulted for 15 minutes, not a scraped one", alert: "KvrouteCapacityDefaulted",
		series: map[string]string{
			`kvroute_worker_capacity_blocks{` + inst + `,worker="w1",source="default"}`: "512x30",
			`kvroute_worker_capacity_blocks{` + inst + `,worker="w0",source="scraped"}`: "4096x30",
		},
		at: "20m",
		fires: []firing{{map[string]string{"instance": host, "job": "kvroute", "worker": "w1", "source": "default"},
			"worker w1's KV capacity is kvroute's default, not its own"}},
	},
}

// Every alert fires where its rule says it should and stays quiet on the cases beside
// it, with the labels its summary names, as promtool's rule unit tests evaluate them.
func TestPrometheusAlertsFireOnTheirCases(t *testing.T) {
	rules := readAlertRules(t)
	type expAlert struct {
		Labels      map[string]string `yaml:"exp_labels"`
		Annotations map[string]string `yaml:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string     `yaml:"eval_time"`
		Alertname string     `yaml:"alertname"`
		ExpAlerts []expAlert `yaml:"exp_alerts"`
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type unitTest struct {
		Name       string      `yaml:"name"`
		Interval   string      `yaml:"interval"`
		Input      []series    `yaml:"input_series"`
		AlertTests []alertTest `yaml:"alert_rule_test"`
	}
	rulesPath, err := filepath.Abs(rulesFile)
	require.NoError(t, err)
	var tests []unitTest
	fired, quiet := map[string]bool{}, map[string]bool{}
	for _, c := range alertCases {
		rule, ok := rules[c.alert]
		require.True(t, ok, "case %q: no rule %s", c.name, c.alert)
		exp := []expAlert{}
		for _, f := range c.fires {
			labels := map[string]string{}
			for k, v := range rule.Labels {
				labels[k] = v
			}
			for k, v := range f.labels {
				labels[k] = v
			}
			exp = append(exp, expAlert{Labels: labels, Annotations: map[string]string{"summary": f.summary, "description": rule.Annotations["description"]}})
		}
		fired[c.alert] = fired[c.alert] || len(c.fires) > 0
		quiet[c.alert] = quiet[c.alert] || len(c.fires) == 0 || len(c.series) > len(c.fires)
		u := unitTest{Name: c.alert + ": " + c.name, Interval: "1m", AlertTests: []alertTest{{EvalTime: c.at, Alertname: c.alert, ExpAlerts: exp}}}
		for _, s := range slices.Sorted(maps.Keys(c.series)) {
			u.Input = append(u.Input, series{Series: s, Values: c.series[s]})
		}
		tests = append(tests, u)
	}
	for name := range rules {
		assert.True(t, fired[name], "no case shows %s firing", name)
		assert.True(t, quiet[name], "no case shows %s quiet on a series it reads", name)
	}
	raw, err := yaml.Marshal(map[string]any{"rule_files": []string{rulesPath}, "evaluation_interval": "1m", "tests": tests})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "prometheus-rules.test.yaml")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	runPromtool(t, "test", "rules", path)
}

// The cases' series carry the labels kvroute exports for their metric, no more and no
// fewer (besides Prometheus's instance and job), so a rule grouping by a label its
// metric lacks fails its case.
func TestPrometheusAlertCasesUseKvroutesLabels(t *testing.T) {
	exported := exportedLabels(t)
	notation := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$`)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="[^"]*"`)
	for _, c := range alertCases {
		for s := range c.series {
			m := notation.FindStringSubmatch(s)
			require.NotNil(t, m, "case %q: series %s", c.name, s)
			name := m[1]
			var got []string
			for _, l := range label.FindAllStringSubmatch(m[2], -1) {
				if l[1] != "instance" && l[1] != "job" {
					got = append(got, l[1])
				}
			}
			slices.Sort(got)
			if name == "up" {
				assert.Empty(t, got, "case %q: %s", c.name, s)
				continue
			}
			want, ok := exported[name]
			if !ok {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, cut := strings.CutSuffix(name, suffix); cut {
						if want, ok = exported[base]; ok && suffix == "_bucket" {
							want = append(slices.Clone(want), "le")
							slices.Sort(want)
						}
						if ok {
							break
						}
					}
				}
			}
			require.True(t, ok, "case %q: kvroute does not export %s", c.name, name)
			assert.Equal(t, want, got, "case %q: labels of %s", c.name, s)
		}
	}
}
