package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

const minimal = `
workers:
  - {name: a, address: "127.0.0.1:8001"}
`

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := Load("../examples/kvroute.yaml")
	require.NoError(t, err)
	assert.Equal(t, 16, cfg.Router.BlockSize)
	assert.Len(t, cfg.Router.Workers, 2)
	assert.Equal(t, "kv", cfg.Policy.Picker)
	assert.Equal(t, scoring.DefaultParamsFor(16), cfg.Policy.Params, "the example spells out the built-in default policy at its block size")
}

func TestMinimalConfigTakesDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err)
	def := Default()
	assert.Equal(t, ":9002", cfg.GRPCAddress)
	assert.Equal(t, "127.0.0.1:9090", cfg.AdminAddress)
	assert.Equal(t, def.Filter, cfg.Filter)
	assert.Equal(t, def.Index, cfg.Index)
	assert.Equal(t, def.Policy, cfg.Policy)
}

// TestThePolicysDefaultsFollowTheBlockSize: the per-request weights' defaults stand for
// tokens of prefill and the cost counts blocks, so a config with block_size 16 and no
// policy gets them scaled (×4), and a weight the config sets is kept as written.
func TestThePolicysDefaultsFollowTheBlockSize(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		wantQueue float64
		wantLoRA  float64
	}{
		{"the reference block size", minimal, 64, 1024},
		{"vLLM's", "block_size: 16\n" + minimal, 256, 4096},
		{"larger blocks", "block_size: 128\n" + minimal, 32, 512},
		{"a weight the config sets", "block_size: 16\npolicy: {queue_weight: 64}\n" + minimal, 64, 4096},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml))
			require.NoError(t, err)
			assert.Equal(t, tt.wantQueue, cfg.Policy.Params.QueueWeight)
			assert.Equal(t, tt.wantLoRA, cfg.Policy.Params.LoRAWeight)
			assert.Equal(t, scoring.DefaultParams().PrefixAffinityWeight, cfg.Policy.Params.PrefixAffinityWeight, "a weight per block is the same at any block size")
		})
	}
}

func TestDiscoveredWorkersNeedNoList(t *testing.T) {
	cfg, err := Parse([]byte("discovery:\n  source: kubernetes\n  kubernetes: {pool: qwen, models_annotation: kvroute.io/models}\n"))
	require.NoError(t, err)
	assert.Empty(t, cfg.Router.Workers)
	assert.Equal(t, "qwen", cfg.Discovery.Kubernetes.Pool)
	next := cfg
	next.Discovery.Kubernetes.Pool = "other"
	assert.Equal(t, []string{"discovery"}, RestartKeys(cfg, next), "discovery changes need a restart")
	next = cfg
	next.Peers.DNS = "kvroute-peers:9090"
	assert.Equal(t, []string{"peers"}, RestartKeys(cfg, next), "so do peers changes")
	next = cfg
	next.Router.LoRAAdapters = []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	assert.Equal(t, []string{"lora_adapters"}, RestartKeys(cfg, next), "and LoRA adapters")
	next = cfg
	next.Router.LoRAResidency = time.Minute
	assert.Equal(t, []string{"lora_residency"}, RestartKeys(cfg, next), "and their residency")
	next = cfg
	next.Filter.DefaultModel = "qwen"
	require.Len(t, RestartKeys(cfg, next), 1)
	assert.Contains(t, RestartKeys(cfg, next)[0], "default_model", "the refusal names the key changed")
	withEmpty, err := Parse([]byte(minimal + "lora_adapters: []\n"))
	require.NoError(t, err)
	without, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Empty(t, RestartKeys(withEmpty, without), "an empty adapter list is no list")
}

// TestTokenizerOptionsAreReadOnceAtStart: the tokenizers' per-model options, such as
// exclude_tools_when_tool_choice_none (which mirrors an engine flag an engine takes at
// its start too), are read with the tokenizers, so a reload that changes one is
// refused, naming the section, until a restart.
func TestTokenizerOptionsAreReadOnceAtStart(t *testing.T) {
	const tokenizers = "tokenizers:\n  qwen:\n    builtin: qwen3\n"
	cfg, err := Parse([]byte(minimal + tokenizers))
	require.NoError(t, err)
	next, err := Parse([]byte(minimal + tokenizers + "    exclude_tools_when_tool_choice_none: true\n"))
	require.NoError(t, err)
	assert.True(t, next.Tokenizers["qwen"].ExcludeToolsWhenToolChoiceNone)
	assert.Equal(t, []string{"tokenizers (loaded once, at start)"}, RestartKeys(cfg, next))
	assert.Empty(t, RestartKeys(next, next))
}

func TestAWorkerMaySayItsEngineSpeaksH2C(t *testing.T) {
	cfg, err := Parse([]byte("workers:\n  - {name: a, address: 127.0.0.1:8001, protocol: h2c}\n  - {name: b, address: 127.0.0.1:8002, protocol: http}\n  - {name: c, address: 127.0.0.1:8003}\n"))
	require.NoError(t, err)
	var h2c []bool
	for _, w := range cfg.Router.Workers {
		h2c = append(h2c, w.H2C())
	}
	assert.Equal(t, []bool{true, false, false}, h2c, "only protocol: h2c is h2c; http and no protocol are HTTP/1.1")
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"unknown key", minimal + "colour: blue\n", "colour"},
		{"unknown policy key", minimal + "policy: {prefix_afinity_weight: 1}\n", "prefix_afinity_weight"},
		{"duplicate key", minimal + "block_size: 4\nblock_size: 8\n", "block_size"},
		{"no workers", "block_size: 4\n", "workers"},
		{"bad worker address", "workers: [{name: a, address: vllm:8000}]\n", "workers[0].address"},
		{"an IPv4-mapped address", "workers: [{name: a, address: \"[::ffff:10.0.0.1]:8000\"}]\n", `workers[0].address: write "[::ffff:10.0.0.1]:8000" as "10.0.0.1:8000"`},
		{"IPv6 in capitals", "workers: [{name: a, address: \"[FD00:0::1]:8000\"}]\n", `workers[0].address: write "[FD00:0::1]:8000" as "[fd00::1]:8000"`},
		{"worker name too long for the peers' reports", "workers: [{name: " + strings.Repeat("w", 513) + ", address: 127.0.0.1:8000}]\n", "workers[0].name: at most 512 bytes"},
		{"adapter without a base model", minimal + "lora_adapters: [{name: sql}]\n", "lora_adapters[0].base_model"},
		{"unknown adapter key", minimal + "lora_adapters: [{name: sql, base_model: qwen, base: llama}]\n", "field base not found"},
		{"residency not a duration", minimal + "lora_residency: 30\n", "lora_residency"},
		{"negative residency", minimal + "lora_residency: -1s\n", "lora_residency"},
		{"negative max_loras", "workers: [{name: a, address: 127.0.0.1:8000, max_loras: -1}]\n", "workers[0].max_loras"},
		{"worker lists an adapter", "lora_adapters: [{name: sql, base_model: qwen}]\nworkers: [{name: a, address: 127.0.0.1:8000, models: [sql]}]\n", "workers[0].models[0]"},
		{"discovered models naming an adapter", "lora_adapters: [{name: sql, base_model: qwen}]\ndiscovery:\n  source: kubernetes\n  kubernetes: {pool: qwen, models: [sql]}\n", "discovery.kubernetes.models[0]"},
		{"tokenizer for an adapter", minimal + "lora_adapters: [{name: sql, base_model: qwen}]\ntokenizers: {sql: {approx: true}}\n", "tokenizers.sql"},
		{"negative max_num_seqs", "workers: [{name: a, address: 127.0.0.1:8000, max_num_seqs: -1}]\n", "workers[0].max_num_seqs"},
		{"unknown worker protocol", "workers: [{name: a, address: 127.0.0.1:8000, protocol: http2}]\n", "workers[0].protocol"},
		{"shared prefix affinity above 1", minimal + "policy: {shared_prefix_affinity: 2}\n", "policy.shared_prefix_affinity"},
		{"negative queue weight", minimal + "policy: {queue_weight: -1}\n", "policy.queue_weight"},
		{"negative interference weight", minimal + "policy: {interference_weight: -0.5}\n", "policy.interference_weight"},
		{"negative prefill history weight", minimal + "policy: {prefill_history_weight: -1}\n", "policy.prefill_history_weight"},
		{"infinite prefill history half-life", minimal + "policy: {prefill_history_half_life: .inf}\n", "policy.prefill_history_half_life"},
		{"negative weight", minimal + "policy: {prefix_affinity_weight: -1}\n", "policy.prefix_affinity_weight"},
		{"NaN weight", minimal + "policy: {overlap_credit: .nan}\n", "policy.overlap_credit"},
		{"unknown picker", minimal + "policy: {picker: fastest}\n", "policy.picker"},
		{"x-envoy destination", minimal + "destination_header: x-envoy-original-dst-host\n", "destination_header"},
		{"bad body mode", minimal + "request_body_mode: STREAMED\n", "request_body_mode"},
		{"zero body cap", minimal + "max_body_bytes: 0\n", "max_body_bytes"},
		{"body cap above 64 MiB", minimal + "max_body_bytes: 67108865\n", "max_body_bytes: must be in [1, 67108864]"},
		{"zero json depth", minimal + "max_json_depth: 0\n", "max_json_depth"},
		{"json depth past the ceiling", minimal + "max_json_depth: 10001\n", "max_json_depth"},
		{"zero prompt tokens", minimal + "max_prompt_tokens: 0\n", "max_prompt_tokens"},
		{"model header not a header name", minimal + "model_header: \"x model\"\n", "model_header"},
		{"model header is the destination", minimal + "model_header: X-Gateway-Destination-Endpoint\n", "model_header: must differ"},
		{"bad ttl", minimal + "index: {ttl: -1s}\n", "index.ttl"},
		{"zero capacity", minimal + "index: {capacity_blocks: 0}\n", "index.capacity_blocks"},
		{"relative health path", minimal + "health: {path: health}\n", "health.path"},
		{"health backoff below min", minimal + "health: {backoff_min: 10s, backoff_max: 1s}\n", "health.backoff_max"},
		{"health interval not a duration", minimal + "health:\n  interval: often\n", "health.interval"},
		{"engine metrics without a path", minimal + "engine_metrics: {path: \"\"}\n", "engine_metrics.path"},
		{"bad log level", minimal + "log_level: loud\n", "log_level"},
		{"peer without a port", minimal + "peers: {addresses: [kvroute-0]}\n", "peers.addresses[0]: must be host:port"},
		{"peers stream changes too slowly", minimal + "peers: {dns: \"kvroute-peers:9090\", interval: 1s}\n", "peers.interval"},
		{"explain sample rate over 1", minimal + "explain: {sample_rate: 2}\n", "explain.sample_rate"},
		{"explain header is the destination", minimal + "explain: {header: X-Gateway-Destination-Endpoint}\n", "explain.header"},
		{"explain header is the session header", minimal + "explain: {header: x-session-id}\n", "explain.header"},
		{"prefill header is the session header", minimal + "prefill_header: X-Session-Id\n", "prefill_header"},
		{"prefill header is the explain header", minimal + "prefill_header: x-kvroute-explain\n", "prefill_header"},
		{"session header is the destination", minimal + "session: {header: x-gateway-destination-endpoint}\n", "session.header"},
		{"session header is the model header", minimal + "session: {header: X-Gateway-Model-Name}\n", `session.header: "X-Gateway-Model-Name" is the model_header`},
		{"session without a ttl", minimal + "session: {ttl: 0s}\n", "session.ttl"},
		{"an agent session header is the explain header", minimal + "session: {agent_headers: [x-kvroute-explain]}\n", `session.agent_headers[0]: "x-kvroute-explain" is the explain.header`},
		{"an agent session header is the destination", minimal + "session: {agent_headers: [session-id, x-gateway-destination-endpoint]}\n", "session.agent_headers[1]"},
		{"unknown session key", minimal + "session: {max_sessions: 1}\n", "max_sessions"},
		{"responses without a ttl", minimal + "responses: {ttl: 0s}\n", "responses.ttl"},
		{"responses memory past the ceiling", minimal + "responses: {max_entries: 10000001}\n", "responses.max_entries"},
		{"a responses path ending in a slash", minimal + "responses_paths: [/v1/responses/]\n", "responses_paths: \"/v1/responses/\" must not end with /"},
		{"a path listed under two keys", minimal + "responses_paths: [/v1/chat/completions]\n", "\"/v1/chat/completions\" is listed twice"},
		{"a path with a query", minimal + "responses_paths: [\"/v1/responses?x=1\"]\n", "must be a path alone"},
		{"negative session weight", minimal + "policy: {session_affinity_weight: -1}\n", "policy.session_affinity_weight"},
		{"two documents", minimal + "---\n" + minimal, "more than one YAML document"},
		{"wrong type", minimal + "block_size: many\n", "block_size"},
		{"workers with discovery", minimal + "discovery: {source: kubernetes, kubernetes: {pool: qwen}}\n", "workers: must be absent unless discovery.source is static"},
		{"unknown discovery key", "discovery:\n  source: file\n  file:\n    path: w.yaml\n    watch: true\n", "discovery.file.watch"},
		{"discovery without its section", "discovery: {source: kubernetes}\n", "discovery.kubernetes.pool"},
		{"bad capacity unit", minimal + "engine_metrics: {capacity_unit: bytes}\n", "engine_metrics.capacity_unit"},
		{"two engine key sources", minimal + "tokenizers: {m: {engine: {url: 'http://h:1', api_key_file: /k, api_key_env: K}}}\n", "tokenizers.m.engine.api_key_file: only one of"},
		{"engine key variable not a name", minimal + "tokenizers: {m: {engine: {url: 'http://h:1', api_key_env: 'my key'}}}\n", "tokenizers.m.engine.api_key_env: want an environment variable name"},
		{"engine key written in the config", minimal + "tokenizers: {m: {engine: {url: 'http://h:1', api_key: sk-live}}}\n", "api_key not found"},
		{"tools excluded for an engine that renders them", minimal + "tokenizers: {m: {engine: {url: 'http://h:1'}, exclude_tools_when_tool_choice_none: true}}\n",
			"tokenizers.m.exclude_tools_when_tool_choice_none: not read with engine"},
		{"tools excluded sometimes", minimal + "tokenizers:\n  m:\n    builtin: qwen3\n    exclude_tools_when_tool_choice_none: sometimes\n",
			"(tokenizers.m.exclude_tools_when_tool_choice_none): cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "sk-live", "a key written in the config is not echoed")
		})
	}
}

func TestOffloadBlockSizeMustBeWholeBlocks(t *testing.T) {
	for _, tt := range []struct {
		size int
		want string
	}{
		{0, ""},
		{64, ""},
		{24, "kv_events.offload_block_size: must be a multiple of block_size (16), got 24"},
	} {
		cfg, err := Parse([]byte(minimal))
		require.NoError(t, err)
		cfg.Router.BlockSize, cfg.KVEvents.OffloadBlockSize = 16, tt.size
		err = cfg.Validate()
		if tt.want == "" {
			assert.NoError(t, err, "size %d", tt.size)
			continue
		}
		assert.EqualError(t, err, tt.want)
	}
}

// The priority section reads as GIE's defaults, its errors name the key, and a reload
// may change its objectives alone.
func TestPrioritySection(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, priority.DefaultConfig(), cfg.Priority)

	cfg, err = Parse([]byte(minimal + "priority:\n  objectives: {batch: -1, chat: 10}\n  queue_depth_threshold: 2\n  kv_cache_util_threshold: 0.9\n  metrics_staleness_threshold: 2s\n"))
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"batch": -1, "chat": 10}, cfg.Priority.Objectives)
	assert.Equal(t, priority.Saturation{QueueDepth: 2, KVCacheUtil: 0.9, Staleness: 2 * time.Second}, cfg.Priority.Saturation())

	for _, tt := range []struct{ name, yaml, want string }{
		{"unknown key", "priority: {objective_header: x}\n", "objective_header"},
		{"a priority that is no integer", "priority:\n  objectives:\n    batch: low\n", "(priority.objectives.batch): cannot unmarshal"},
		{"an objective name with a space", "priority: {objectives: {\"batch jobs\": -1}}\n", `priority.objectives: objective "batch jobs"`},
		{"KV threshold as a percentage", "priority: {kv_cache_util_threshold: 80}\n", "priority.kv_cache_util_threshold"},
		{"negative queue threshold", "priority: {queue_depth_threshold: -1}\n", "priority.queue_depth_threshold"},
		{"staleness below the scrape interval", "priority: {metrics_staleness_threshold: 200ms}\n", "priority.metrics_staleness_threshold: 200ms is shorter than engine_metrics.interval (1s)"},
		{"the objective header is the session header", "priority: {header: X-Session-Id}\n", `priority.header: "X-Session-Id" is the session.header`},
		{"the objective header is the model header", "priority: {header: x-gateway-model-name}\n", "is the model_header"},
		{"the objective header is the destination", "priority: {header: x-gateway-destination-endpoint}\n", "is the destination_header"},
		{"the objective header is the prefill header", "priority: {header: x-prefiller-host-port}\n", "is the prefill_header"},
		{"the objective header is the explain header", "priority: {header: x-kvroute-explain}\n", "is the explain.header"},
		{"the objective header's alias is the session header", "session: {header: x-gateway-inference-objective}\n", `priority.header's alias: "x-gateway-inference-objective" is the session.header`},
		{"the legacy objective header read with its new name", "priority: {header: x-gateway-inference-objective}\nsession: {header: X-LLM-D-Inference-Objective}\n", `priority.header's alias: "x-llm-d-inference-objective" is the session.header`},
		{"the objective header is the model-name rewrite header", "priority: {header: x-gateway-model-name-rewrite}\n", `priority.header: "x-gateway-model-name-rewrite" is the model-name rewrite header (fixed)`},
		{"the session header is the model-name rewrite header", "session: {header: x-llm-d-model-name-rewrite}\n", `session.header: "x-llm-d-model-name-rewrite" is the model-name rewrite header (fixed)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal + tt.yaml))
			assert.ErrorContains(t, err, tt.want)
		})
	}
	_, err = Parse([]byte(minimal + "engine_metrics: {interval: 50ms}\npriority: {metrics_staleness_threshold: 200ms}\n"))
	assert.NoError(t, err, "GIE's staleness over GIE's scrape interval")
	_, err = Parse([]byte(minimal + "priority: {header: \"\"}\n"))
	assert.NoError(t, err, "the header off")

	next := cfg
	next.Priority.Objectives = map[string]int{"batch": -2}
	assert.Empty(t, RestartKeys(cfg, next), "the objectives are reloaded")
	next = cfg
	next.Priority.QueueDepthThreshold = 7
	assert.Equal(t, []string{"priority (but its objectives)"}, RestartKeys(cfg, next))
	next = cfg
	next.Priority.Header = "x-objective"
	assert.Equal(t, []string{"priority (but its objectives)"}, RestartKeys(cfg, next))
}

// The flow_control section is off by default, its errors name the key, its fairness
// header (read only when it is on) may not be another header kvroute reads, and a
// change needs a restart.
func TestFlowControlSection(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, flowcontrol.DefaultConfig(), cfg.FlowControl)
	assert.False(t, cfg.FlowControl.Enabled)

	next, err := Parse([]byte(minimal + "flow_control:\n  enabled: true\n  max_wait: 20s\n  max_queued: 64\n  holder_wait: 500ms\n  hold_on_saturation: true\n  override_message_timeout: 25s\n  fairness_header: x-tenant\n"))
	require.NoError(t, err)
	assert.Equal(t, flowcontrol.Config{Enabled: true, MaxWait: 20 * time.Second, MaxQueued: 64, HolderWait: 500 * time.Millisecond,
		HoldOnSaturation: true, OverrideMessageTimeout: 25 * time.Second, FairnessHeader: "x-tenant"}, next.FlowControl)
	assert.Equal(t, []string{"flow_control"}, RestartKeys(cfg, next))

	for _, tt := range []struct{ name, yaml, want string }{
		{"unknown key", "flow_control: {ttl: 1s}\n", "ttl"},
		{"no wait", "flow_control: {max_wait: 0s}\n", "flow_control.max_wait"},
		{"no room", "flow_control: {max_queued: 0}\n", "flow_control.max_queued"},
		{"a holder wait past max_wait", "flow_control: {max_wait: 1s, holder_wait: 2s}\n", "flow_control.holder_wait"},
		{"a timer override under Envoy's 1 ms", "flow_control: {override_message_timeout: 500us}\n", "flow_control.override_message_timeout"},
		{"a timer override past its bound", "flow_control: {override_message_timeout: 2h}\n", "flow_control.override_message_timeout"},
		{"a negative timer override", "flow_control: {override_message_timeout: -1s}\n", "flow_control.override_message_timeout"},
		{"a header that is no header", "flow_control: {fairness_header: \"x tenant\"}\n", "flow_control.fairness_header"},
		{"the fairness header is the session header", "flow_control: {enabled: true, fairness_header: X-Session-Id}\n", `flow_control.fairness_header: "X-Session-Id" is the session.header`},
		{"the fairness header's alias is the objective header", "flow_control: {enabled: true}\npriority: {header: x-gateway-inference-fairness-id}\n", `flow_control.fairness_header's alias: "x-gateway-inference-fairness-id" is the priority.header`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal + tt.yaml))
			assert.ErrorContains(t, err, tt.want)
		})
	}
	_, err = Parse([]byte(minimal + "flow_control: {fairness_header: X-Session-Id}\n"))
	assert.NoError(t, err, "off, the fairness header is not read")
}

// A seeded policy's random streams are reproducible, Rand is stream 0, and different
// streams of one seed draw different numbers (the destination and prefill pickers
// each have their own).
func TestPolicyRandStreamsAreSeededAndIndependent(t *testing.T) {
	draws := func(r interface{ Uint64() uint64 }) []uint64 {
		out := make([]uint64, 8)
		for i := range out {
			out[i] = r.Uint64()
		}
		return out
	}
	p := Policy{Seed: 42}
	assert.Equal(t, draws(p.Rand()), draws(p.RandStream(0)), "Rand is stream 0")
	assert.Equal(t, draws(p.RandStream(1)), draws(p.RandStream(1)), "a stream is reproducible")
	assert.NotEqual(t, draws(p.RandStream(0)), draws(p.RandStream(1)), "streams differ")
	assert.NotEqual(t, draws(Policy{Seed: 43}.RandStream(1)), draws(p.RandStream(1)), "seeds differ")
}
