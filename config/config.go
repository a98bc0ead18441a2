package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/enginemodels"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/peers"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize/models"
)

// Config is kvroute's config file: each package's section, composed. Keys are
// documented in the README.
type Config struct {
	GRPCAddress  string `yaml:"grpc_address"`
	AdminAddress string `yaml:"admin_address"`
	// AdminRemoteChanges lets non-loopback clients of the admin port change routing
	// (PUT /policy, POST /reload). Off: only loopback (a sidecar, kubectl exec) may; any
	// client may read /metrics and /policy.
	AdminRemoteChanges bool          `yaml:"admin_remote_changes"`
	ShutdownGrace      time.Duration `yaml:"shutdown_grace"`
	LogLevel           string        `yaml:"log_level"`
	// TLS secures the ext_proc listener (mTLS with a client CA); off when absent.
	TLS server.TLSConfig `yaml:"tls"`
	// AdminTLS secures the admin port the same way: the replicas' load reports
	// (peers), the policy API and /metrics are then served over TLS only, and only to
	// clients with a certificate of the client CA when one is given.
	AdminTLS server.TLSConfig `yaml:"admin_tls"`
	// HealthAddress, when set, also serves gRPC health in plaintext there (kubelet's
	// gRPC probes speak no TLS).
	HealthAddress string `yaml:"health_address"`
	// AdminPprof serves Go's profiles under /debug/pprof/ on the admin port (loopback
	// only unless admin_remote_changes): off by default, since a profile shows what the
	// process holds and a CPU profile costs while it runs.
	AdminPprof bool `yaml:"admin_pprof"`

	Router router.Config `yaml:",inline"` // block_size, workers
	Filter filter.Config `yaml:",inline"` // destination_header, max_body_bytes, paths, body modes
	Policy Policy        `yaml:"policy"`
	Index  index.Config  `yaml:"index"`
	Health health.Config `yaml:"health"`
	// EngineMetrics is scraped from every worker: its KV capacity always, its load
	// signals for the pickers that read them (gie) and for the priority section's
	// saturation rule.
	EngineMetrics enginemetrics.Config `yaml:"engine_metrics"`
	// EngineModels is each worker's model list (/v1/models): which LoRA adapters its
	// engine has loaded, so that an adapter's requests go only where it is.
	EngineModels enginemodels.Config `yaml:"engine_models"`
	Explain      explain.Config      `yaml:"explain"`
	Session      session.Config      `yaml:"session"`
	// Responses bounds the memory of which worker stored each Responses API response
	// (filter.responses_paths).
	Responses session.ResponsesConfig `yaml:"responses"`
	// Priority reads each request's GIE objective and sheds sheddable ones (priority
	// below 0) when no worker has capacity.
	Priority priority.Config `yaml:"priority"`
	// FlowControl holds the requests no worker can take (every candidate at
	// max_active_requests_per_worker, or a sheddable request on a saturated fleet) and
	// lets them go by priority, fairness id and arrival, instead of refusing them at once.
	FlowControl flowcontrol.Config `yaml:"flow_control"`
	// ModelRewrites send requests for a model to other models (aliases, weighted
	// splits), as GIE's InferenceModelRewrite does; the pool's InferenceModelRewrites
	// join them. Reloadable.
	ModelRewrites rewrite.Config `yaml:"model_rewrites"`
	// KVEvents is how the workers' KV event streams are consumed (workers with a
	// kv_events key).
	KVEvents kvevents.Config `yaml:"kv_events"`
	// Discovery says where workers come from: the `workers` list (static), a watched
	// file, or a Kubernetes InferencePool.
	Discovery discovery.Config `yaml:"discovery"`
	// Peers are the other kvroute replicas in front of the same workers: each watches the
	// others' booked load so that its cost sees their requests too. Off when empty.
	Peers peers.Config `yaml:"peers"`
	// Tokenizers gives each model its tokenizer and chat template (or engine render
	// endpoint); a model without an entry uses the "default" one, else the embedded one.
	Tokenizers models.Config `yaml:"tokenizers"`
}

// Policy selects the picker and, for kv, its cost parameters.
type Policy struct {
	// Picker is kv (the cost of DESIGN §3), round_robin, random, least_load, gie (the
	// endpoint picker's default scorer, with engine metrics scraped), or gie-lora (gie with
	// its LoRA-affinity scorer).
	Picker string `yaml:"picker"`
	// Seed seeds tie-breaking and sampling; 0 draws a random seed.
	Seed           uint64 `yaml:"seed"`
	scoring.Params `yaml:",inline"`
}

// Rand returns the random source seeded by Seed for tie-breaking and sampling (the
// destination picker's: RandStream(0)); seed 0 draws a random seed.
func (p Policy) Rand() *rand.Rand { return p.RandStream(0) }

// RandStream returns the stream-th random source seeded by Seed, independent of the
// others: two pickers given sources of one seed would draw the same numbers for each
// request (the destination's and the prefill worker's choices moving together). Seed
// 0 draws a random seed.
func (p Policy) RandStream(stream uint64) *rand.Rand {
	seed := p.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return rand.New(rand.NewPCG(seed, (seed^0x9e3779b97f4a7c15)+stream*0xbf58476d1ce4e5b9))
}

// Default returns the config with every key at its default; workers are still needed.
func Default() Config {
	return Config{
		GRPCAddress:   ":9002",
		AdminAddress:  "127.0.0.1:9090",
		ShutdownGrace: 30 * time.Second,
		LogLevel:      "info",
		Router:        router.Config{BlockSize: router.DefaultBlockSize, LoRAResidency: router.DefaultLoRAResidency},
		Filter:        filter.DefaultConfig(),
		Policy:        Policy{Picker: "kv", Params: scoring.DefaultParams()},
		Index:         index.DefaultConfig(),
		Health:        health.DefaultConfig(),
		EngineMetrics: enginemetrics.DefaultConfig(),
		EngineModels:  enginemodels.DefaultConfig(),
		Explain:       explain.DefaultConfig(),
		Session:       session.DefaultConfig(),
		Responses:     session.DefaultResponsesConfig(),
		Priority:      priority.DefaultConfig(),
		FlowControl:   flowcontrol.DefaultConfig(),
		KVEvents:      kvevents.DefaultConfig(),
		Discovery:     discovery.DefaultConfig(),
		Peers:         peers.DefaultConfig(),
	}
}

// Load reads a YAML config file strictly: unknown keys, duplicate keys and trailing
// documents are errors. Keys not given keep their defaults.
func Load(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return Parse(raw)
}

// Parse decodes and validates a YAML config, as Load does.
func Parse(raw []byte) (Config, error) {
	cfg, err := decode(raw)
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// decode reads a YAML config over the defaults without validating it. The policy's
// defaults are those for the config's block_size (scoring.DefaultParamsFor): its
// per-request weights stand for tokens of prefill, and the cost counts blocks.
func decode(raw []byte) (Config, error) {
	cfg := Default()
	var head struct {
		BlockSize int `yaml:"block_size"`
	}
	// A first, lenient look for block_size alone; the strict pass below reports any
	// error in it.
	if err := yaml.Unmarshal(raw, &head); err == nil && head.BlockSize > 0 {
		cfg.Policy.Params = scoring.DefaultParamsFor(head.BlockSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse: %s", nameLines(err.Error(), raw))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("parse: more than one YAML document")
	}
	return cfg, nil
}

// Validate checks every section; errors name the YAML key.
func (c Config) Validate() error {
	if c.GRPCAddress == "" {
		return errors.New("grpc_address: must not be empty")
	}
	if c.AdminAddress == "" {
		return errors.New("admin_address: must not be empty")
	}
	if c.HealthAddress != "" {
		if _, _, err := net.SplitHostPort(c.HealthAddress); err != nil {
			return fmt.Errorf("health_address: must be host:port, got %q", c.HealthAddress)
		}
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if err := c.AdminTLS.ValidateSection("admin_tls"); err != nil {
		return err
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown_grace: must be ≥ 0, got %s", c.ShutdownGrace)
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		return err
	}
	if err := c.Discovery.Validate(); err != nil {
		return err
	}
	if err := c.Discovery.CheckWorkers(len(c.Router.Workers)); err != nil {
		return err
	}
	if err := c.Router.Validate(); err != nil {
		return err
	}
	for _, a := range c.Router.LoRAAdapters {
		for i, m := range c.Discovery.Kubernetes.Models {
			if m == a.Name {
				return fmt.Errorf("discovery.kubernetes.models[%d]: %q is a LoRA adapter (lora_adapters): list its base model %q; a worker serving the base serves its adapters", i, m, a.BaseModel)
			}
		}
		if _, ok := c.Tokenizers[a.Name]; ok {
			// Never used: an adapter's prompts are encoded by its base model's entry.
			return fmt.Errorf("tokenizers.%s: %q is a LoRA adapter (lora_adapters): its prompts use the entry of its base model %q", a.Name, a.Name, a.BaseModel)
		}
	}
	if err := c.Filter.Validate(); err != nil {
		return err
	}
	if _, ok := scoring.Pickers()[c.Policy.Picker]; !ok {
		return fmt.Errorf("policy.picker: unknown picker %q (%s)", c.Policy.Picker, scoring.PickerNames())
	}
	if err := c.Policy.Params.Validate(); err != nil {
		return fmt.Errorf("policy.%w", err)
	}
	if err := c.Index.Validate(); err != nil {
		return err
	}
	if err := c.EngineMetrics.Validate(); err != nil {
		return err
	}
	if err := c.EngineModels.Validate(); err != nil {
		return err
	}
	if err := c.validateRequestHeaders(); err != nil {
		return err
	}
	if s := c.Priority.MetricsStalenessThreshold; s > 0 && s < c.EngineMetrics.Interval {
		// Every reading would be stale between two scrapes, and every sheddable request
		// refused.
		return fmt.Errorf("priority.metrics_staleness_threshold: %s is shorter than engine_metrics.interval (%s): between two scrapes no worker would have capacity", s, c.EngineMetrics.Interval)
	}
	if err := c.KVEvents.Validate(); err != nil {
		return err
	}
	if n := c.KVEvents.OffloadBlockSize; n > 0 && c.Router.BlockSize > 0 && n%c.Router.BlockSize != 0 {
		return fmt.Errorf("kv_events.offload_block_size: must be a multiple of block_size (%d), got %d", c.Router.BlockSize, n)
	}
	if err := c.Tokenizers.Validate(); err != nil {
		return err
	}
	if err := c.Peers.Validate(); err != nil {
		return err
	}
	// The replicas watch one another's admin ports: what one serves, the others must speak.
	switch {
	case c.Peers.TLS.Enabled() && !c.Peers.Enabled():
		return errors.New("peers.tls: set without peers.addresses or peers.dns (it is how this replica watches its peers)")
	case c.Peers.TLS.Enabled() && !c.AdminTLS.Enabled():
		return errors.New("admin_tls: required with peers.tls (the other replicas watch this one's admin port over TLS)")
	case c.Peers.Enabled() && c.AdminTLS.Enabled() && !c.Peers.TLS.Enabled():
		return errors.New("peers.tls: required when admin_tls is set and peers are configured (the other replicas' admin ports speak TLS)")
	case c.Peers.Enabled() && c.AdminTLS.ClientCAFile != "" && c.Peers.TLS.CertFile == "":
		return errors.New("peers.tls.cert_file: required when admin_tls.client_ca_file is set and peers are configured (the other replicas' admin ports serve only clients with a certificate)")
	}
	return c.Health.Validate()
}

// validateRequestHeaders checks the sections that read request headers against each
// other: the explain header is removed before forwarding, so it must not be the
// destination or the session header.
func (c Config) validateRequestHeaders() error {
	if err := c.Explain.Validate(); err != nil {
		return err
	}
	if err := c.Session.Validate(); err != nil {
		return err
	}
	if err := c.Responses.Validate(); err != nil {
		return err
	}
	if err := c.ModelRewrites.Validate(); err != nil {
		return err
	}
	if err := c.Priority.Validate(); err != nil {
		return err
	}
	if err := c.FlowControl.Validate(); err != nil {
		return err
	}
	// kvroute's request headers must differ: it reads the session, explain, objective
	// and model-name rewrite headers as theirs (sharing one would give it another's
	// value), and sets or removes the destination and prefill headers on every request
	// (sharing one would lose the client's value). An empty name is a header turned off.
	// The model-name rewrite headers are fixed (llm-d-router's), so they come first: an
	// error names the configurable key. The filter keys' own pairs (destination, model,
	// prefill) are filter.Config.Validate's.
	headers := []struct{ key, name string }{
		{"model-name rewrite header (fixed)", rewrite.Header}, {"model-name rewrite header (fixed)", rewrite.LegacyHeader},
		{"destination_header", c.Filter.DestinationHeader}, {"model_header", c.Filter.ModelHeader},
		{"session.header", c.Session.Header}, {"explain.header", c.Explain.Header},
		{"prefill_header", c.Filter.PrefillHeader},
	}
	if c.Session.Header != "" {
		for i, h := range c.Session.AgentHeaders {
			headers = append(headers, struct{ key, name string }{fmt.Sprintf("session.agent_headers[%d]", i), h})
		}
	}
	for _, h := range c.Priority.Headers() {
		key := "priority.header's alias"
		if strings.EqualFold(h, c.Priority.Header) {
			key, h = "priority.header", c.Priority.Header
		}
		headers = append(headers, struct{ key, name string }{key, h})
	}
	for _, h := range c.FlowControl.Headers() {
		key := "flow_control.fairness_header's alias"
		if strings.EqualFold(h, c.FlowControl.FairnessHeader) {
			key, h = "flow_control.fairness_header", c.FlowControl.FairnessHeader
		}
		headers = append(headers, struct{ key, name string }{key, h})
	}
	for i, h := range headers {
		for _, earlier := range headers[:i] {
			if h.name != "" && strings.EqualFold(h.name, earlier.name) {
				return fmt.Errorf("%s: %q is the %s", h.key, h.name, earlier.key)
			}
		}
	}
	return nil
}

// nameLines rewrites yaml.v3's "line N: …" into "line N (key.path): …" so an error
// names the key, not only where it is.
func nameLines(msg string, raw []byte) string {
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return msg
	}
	paths := map[int]string{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := n.Content[i].Value
				if path != "" {
					key = path + "." + key
				}
				if _, seen := paths[n.Content[i].Line]; !seen {
					paths[n.Content[i].Line] = key
				}
				walk(n.Content[i+1], key)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(&root, "")
	for line, path := range paths {
		msg = strings.ReplaceAll(msg, fmt.Sprintf("line %d: ", line), fmt.Sprintf("line %d (%s): ", line, path))
	}
	return msg
}

// ParseLevel reads log_level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log_level: must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// RestartKeys names the keys that differ between two configs and cannot change without
// a restart: everything but the workers, the policy's cost parameters,
// priority.objectives and model_rewrites.
func RestartKeys(running, next Config) []string {
	var keys []string
	for _, f := range []struct {
		key       string
		was, will any
	}{
		{"grpc_address", running.GRPCAddress, next.GRPCAddress},
		{"admin_address", running.AdminAddress, next.AdminAddress},
		{"admin_remote_changes", running.AdminRemoteChanges, next.AdminRemoteChanges},
		{"tls (the files it names are reloaded when they change)", running.TLS, next.TLS},
		{"admin_tls (the files it names are reloaded when they change)", running.AdminTLS, next.AdminTLS},
		{"health_address", running.HealthAddress, next.HealthAddress},
		{"admin_pprof", running.AdminPprof, next.AdminPprof},
		{"shutdown_grace", running.ShutdownGrace, next.ShutdownGrace},
		{"log_level", running.LogLevel, next.LogLevel},
		{"block_size", running.Router.BlockSize, next.Router.BlockSize},
		{"max_active_requests_per_worker", running.Router.MaxActiveRequestsPerWorker, next.Router.MaxActiveRequestsPerWorker},
		{"lora_adapters", nilIfNone(running.Router.LoRAAdapters), nilIfNone(next.Router.LoRAAdapters)},
		{"lora_residency", running.Router.LoRAResidency, next.Router.LoRAResidency},
		{"lora_on_demand", running.Router.LoRAOnDemand, next.Router.LoRAOnDemand},
		{"the filter keys (destination_header, model_header, prefill_header, max_body_bytes, max_concurrent_body_bytes, max_json_depth, max_prompt_tokens, *_paths, default_model, *_body_mode, fallback_endpoints)", running.Filter, next.Filter},
		{"policy.picker", running.Policy.Picker, next.Policy.Picker},
		{"policy.seed", running.Policy.Seed, next.Policy.Seed},
		{"index", running.Index, next.Index},
		{"health", running.Health, next.Health},
		{"engine_metrics", running.EngineMetrics, next.EngineMetrics},
		{"engine_models", running.EngineModels, next.EngineModels},
		{"explain", running.Explain, next.Explain},
		{"session", running.Session, next.Session},
		{"responses", running.Responses, next.Responses},
		{"priority (but its objectives)", withoutObjectives(running.Priority), withoutObjectives(next.Priority)},
		{"flow_control", running.FlowControl, next.FlowControl},
		{"kv_events", running.KVEvents, next.KVEvents},
		{"discovery", running.Discovery, next.Discovery},
		{"peers", running.Peers, next.Peers},
		{"tokenizers (loaded once, at start)", nilIfEmpty(running.Tokenizers), nilIfEmpty(next.Tokenizers)},
	} {
		if !reflect.DeepEqual(f.was, f.will) {
			keys = append(keys, f.key)
		}
	}
	return keys
}

// withoutObjectives is the priority section less its objectives, which a reload
// applies.
func withoutObjectives(c priority.Config) priority.Config {
	c.Objectives = nil
	return c
}

// nilIfNone makes an empty lora_adapters list equal to an absent one.
func nilIfNone(a []router.LoRAAdapter) []router.LoRAAdapter {
	if len(a) == 0 {
		return nil
	}
	return a
}

// nilIfEmpty makes an empty tokenizers section equal to an absent one.
func nilIfEmpty(c models.Config) models.Config {
	if len(c) == 0 {
		return nil
	}
	return c
}
