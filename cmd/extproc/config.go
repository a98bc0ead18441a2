package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// config is kvroute's config file: each package's section, composed. Keys are
// documented in the README.
type config struct {
	GRPCAddress  string `yaml:"grpc_address"`
	AdminAddress string `yaml:"admin_address"`
	// AdminRemoteChanges lets non-loopback clients of the admin port change routing
	// (PUT /policy, POST /reload). Off: only loopback (a sidecar, kubectl exec) may; any
	// client may read /metrics and /policy.
	AdminRemoteChanges bool          `yaml:"admin_remote_changes"`
	ShutdownGrace      time.Duration `yaml:"shutdown_grace"`
	LogLevel           string        `yaml:"log_level"`

	Router router.Config `yaml:",inline"` // block_size, workers
	Filter filter.Config `yaml:",inline"` // destination_header, max_body_bytes, paths, body modes
	Policy policyConfig  `yaml:"policy"`
	Index  index.Config  `yaml:"index"`
	Health health.Config `yaml:"health"`
	// EngineMetrics is scraped only for pickers that read engine signals (gie).
	EngineMetrics enginemetrics.Config `yaml:"engine_metrics"`
}

// policyConfig selects the picker and, for kv, its cost parameters.
type policyConfig struct {
	// Picker is kv (the cost of DESIGN §3), round_robin, random, least_load, or gie (the
	// endpoint picker's default scorer, with engine metrics scraped).
	Picker string `yaml:"picker"`
	// Seed seeds tie-breaking and sampling; 0 draws a random seed.
	Seed           uint64 `yaml:"seed"`
	scoring.Params `yaml:",inline"`
}

func defaultConfig() config {
	return config{
		GRPCAddress:   ":9002",
		AdminAddress:  "127.0.0.1:9090",
		ShutdownGrace: 30 * time.Second,
		LogLevel:      "info",
		Router:        router.Config{BlockSize: router.DefaultBlockSize},
		Filter:        filter.DefaultConfig(),
		Policy:        policyConfig{Picker: "kv", Params: scoring.DefaultParams()},
		Index:         index.DefaultConfig(),
		Health:        health.DefaultConfig(),
		EngineMetrics: enginemetrics.DefaultConfig(),
	}
}

// loadConfig reads a YAML config strictly: unknown keys, duplicate keys and trailing
// documents are errors. Keys not given keep their defaults.
func loadConfig(path string) (config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return config{}, err
	}
	return parseConfig(raw)
}

func parseConfig(raw []byte) (config, error) {
	cfg := defaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return config{}, fmt.Errorf("parse: %s", nameLines(err.Error(), raw))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return config{}, errors.New("parse: more than one YAML document")
	}
	return cfg, cfg.validate()
}

// validate checks every section; errors name the YAML key.
func (c config) validate() error {
	if c.GRPCAddress == "" {
		return errors.New("grpc_address: must not be empty")
	}
	if c.AdminAddress == "" {
		return errors.New("admin_address: must not be empty")
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown_grace: must be ≥ 0, got %s", c.ShutdownGrace)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if len(c.Router.Workers) == 0 {
		return errors.New("workers: at least one worker is required")
	}
	if err := c.Router.Validate(); err != nil {
		return err
	}
	if err := c.Filter.Validate(); err != nil {
		return err
	}
	if _, ok := pickers[c.Policy.Picker]; !ok {
		return fmt.Errorf("policy.picker: unknown picker %q (kv, round_robin, random, least_load, gie)", c.Policy.Picker)
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
	return c.Health.Validate()
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
