package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/tokenize/models"
)

const minimal = `
workers:
  - {name: a, address: "127.0.0.1:8001"}
`

func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(good, []byte(minimal), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte(minimal+"policy: {temperature: -2}\n"), 0o600))

	var out, errOut bytes.Buffer
	assert.Equal(t, 0, run(context.Background(), []string{"validate", "-config", good}, &out, &errOut))
	assert.Contains(t, out.String(), "ok")

	out.Reset()
	assert.Equal(t, 1, run(context.Background(), []string{"validate", "-config", bad}, &out, &errOut))
	assert.Contains(t, errOut.String(), "policy.temperature")

	errOut.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"validate"}, &out, &errOut))
	assert.True(t, strings.Contains(errOut.String(), "-config is required"))

	errOut.Reset()
	assert.Equal(t, 1, run(context.Background(), []string{"validate", "-config", filepath.Join(dir, "missing.yaml")}, &out, &errOut))

	errOut.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"-h"}, &out, &errOut))
	for _, want := range []string{"extproc validate -config", "extproc tokenize", "-grpc-address"} {
		assert.Contains(t, errOut.String(), want, "-h names the subcommands and the flags")
	}
}

// TestValidateReadsTheEngineAPIKey: validate reads an engine's API key as the start
// does; a key file that cannot be read or is empty, or an unset variable, fails it,
// naming the key.
func TestValidateReadsTheEngineAPIKey(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("sk-validate\n"), 0o600))
	emptyFile := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(emptyFile, nil, 0o600))
	t.Setenv("KVROUTE_TEST_RENDER_KEY", "sk-validate")
	engine := func(key string) string {
		return minimal + "tokenizers: {default: {approx: true}, m: {engine: {url: 'http://127.0.0.1:1', " + key + "}}}\n"
	}
	tests := []struct {
		name, yaml string
		code       int
		want       string
	}{
		{"a readable key file", engine("api_key_file: " + keyFile), 0, "ok"},
		{"a set variable", engine("api_key_env: KVROUTE_TEST_RENDER_KEY"), 0, "ok"},
		{"a missing key file", engine("api_key_file: " + filepath.Join(dir, "missing")), 1, "tokenizers.m.engine.api_key_file: open " + filepath.Join(dir, "missing")},
		{"an empty key file", engine("api_key_file: " + emptyFile), 1, "tokenizers.m.engine.api_key_file: " + emptyFile + " is empty"},
		{"an unset variable", engine("api_key_env: KVROUTE_TEST_UNSET_KEY"), 1, "tokenizers.m.engine.api_key_env: the environment variable KVROUTE_TEST_UNSET_KEY is not set or empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvroute.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.yaml), 0o600))
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), []string{"validate", "-config", path}, &out, &errOut), errOut.String())
			assert.Contains(t, out.String()+errOut.String(), tt.want)
			assert.NotContains(t, out.String()+errOut.String(), "sk-validate", "the key is never printed")
		})
	}
}

// TestValidateReadsThePeersToken: validate reads peers.token_file as the start does and
// says that a token is used; a missing, short or spaced secret fails it, naming the key,
// and the secret is never printed.
func TestValidateReadsThePeersToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	good := write("good", "s3cret-s3cret-s3cret\n")
	short := write("short", "s3cret")
	spaced := write("spaced", "s3cret s3cret s3cret")
	huge := write("huge", strings.Repeat("s3cret", 1000))
	tests := []struct {
		name, file string
		code       int
		want       string
	}{
		{"a good secret", good, 0, "token from " + good},
		{"a missing file", filepath.Join(dir, "missing"), 1, "peers.token_file: open " + filepath.Join(dir, "missing")},
		{"a short secret", short, 1, "peers.token_file: the secret must have 16 characters or more"},
		{"a secret with a space", spaced, 1, "peers.token_file: the secret must be printable ASCII without spaces"},
		{"a file too large", huge, 1, "peers.token_file: " + huge + " is larger than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvroute.yaml")
			require.NoError(t, os.WriteFile(path, []byte(minimal+"peers: {addresses: ['10.0.0.2:9090'], token_file: "+tt.file+"}\n"), 0o600))
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), []string{"validate", "-config", path}, &out, &errOut), errOut.String())
			assert.Contains(t, out.String()+errOut.String(), tt.want)
			assert.NotContains(t, out.String()+errOut.String(), "s3cret", "the secret is never printed")
		})
	}
}

// FuzzParseConfig: whatever parses must build. Its seeds are small: the example config
// one key at a time (exampleSections), not the example itself. The engine minimizes
// every input that finds new coverage, at a cost quadratic in its length when, as in a
// YAML document, few bytes can go: a mutation of the 8 KB example took the whole of
// -fuzzminimizetime's 60 s, and the engine counts a minimization's runs only when it
// ends, so 30 s of fuzzing reported 32 execs though some 500 inputs a second ran. The
// example itself is checked whole by TestExampleConfigBuilds.
func FuzzParseConfig(f *testing.F) {
	for _, section := range exampleSections(f, "../../examples/kvroute.yaml") {
		f.Add([]byte(section))
	}
	f.Add([]byte(minimal))
	f.Add([]byte("workers: [{name: a, address: '[::1]:1'}]\npolicy: {picker: kv, temperature: 1e308}"))
	f.Add([]byte(minimal + "tls: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\nhealth_address: '127.0.0.1:0'\n"))
	f.Add([]byte(minimal + "tls: {client_ca_file: x}\nhealth_address: nope\n"))
	f.Add([]byte(minimal + "model_header: \"\"\nmax_body_bytes: 67108864\nmax_json_depth: 10000\nmax_prompt_tokens: 1\n"))
	f.Add([]byte(minimal + "engine_metrics: {interval: 1ns, timeout: 1ns}\nhealth: {interval: 0s}\n"))
	f.Add([]byte(minimal + "tokenizers: {default: {approx: true}, m: {path: /nonexistent}, n: {engine: {url: 'http://127.0.0.1:1'}}}\n"))
	f.Add([]byte(minimal + "tokenizers: {default: {approx: true}, n: {engine: {url: 'http://127.0.0.1:1', api_key_file: /nonexistent}}}\n"))
	f.Add([]byte(minimal + "peers: {token_file: /nonexistent}\n"))
	f.Add([]byte(minimal + "admin_tls: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\npeers: {dns: 'k:1', tls: {server_name: k, ca_file: /nonexistent}}\n"))
	f.Add([]byte(minimal + "peers: {addresses: ['[fe80::1%eth0]:9090'], tls: {server_name: ''}}\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := config.Parse(raw)
		// Discovered workers need their environment (a file, a cluster): the sources'
		// own tests cover them.
		if err != nil || cfg.Discovery.Source != discovery.SourceStatic {
			return
		}
		// Loading the embedded tokenizer (or any real one) for every input slowed
		// fuzzing to one input in seconds: the example config's builtin entry made every
		// mutation of it load Qwen3's. Every entry is the approximate pair here; the
		// tokenizers' own tests and fuzz targets load the real ones.
		if cfg.Tokenizers == nil {
			cfg.Tokenizers = models.Config{}
		}
		for model := range cfg.Tokenizers {
			cfg.Tokenizers[model] = models.Entry{Approx: true}
		}
		cfg.Tokenizers[models.DefaultKey] = models.Entry{Approx: true}
		// Whatever parses must be usable: building the app must not fail or panic, but
		// for the files the tokenizers and peers.token_file name, which are read at
		// start, not parse.
		if _, err := build(cfg, nil, discardLogger()); err != nil &&
			!strings.HasPrefix(err.Error(), "tokenizers.") && !strings.HasPrefix(err.Error(), "peers.token_file: ") {
			t.Fatalf("valid config did not build: %v", err)
		}
	})
}

// TestExampleConfigBuilds: the example config, comments and all, builds (FuzzParseConfig
// seeds with its sections, not with the whole file).
func TestExampleConfigBuilds(t *testing.T) {
	cfg, err := config.Load("../../examples/kvroute.yaml")
	require.NoError(t, err)
	for model := range cfg.Tokenizers { // the fuzz target's approximate tokenizers
		cfg.Tokenizers[model] = models.Entry{Approx: true}
	}
	_, err = build(cfg, nil, discardLogger())
	require.NoError(t, err)
}

// exampleSections returns the config at path one key at a time, at most two levels
// deep (policy.picker, workers[0]), each in flow style, without comments, after
// minimal's workers (but for a workers seed): every key of the example in a seed of
// about 100 bytes.
func exampleSections(tb testing.TB, path string) []string {
	tb.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(tb, err)
	var doc yaml.Node
	require.NoError(tb, yaml.Unmarshal(raw, &doc))
	require.Len(tb, doc.Content, 1)
	top := doc.Content[0]
	require.Equal(tb, yaml.MappingNode, top.Kind)
	var sections []string
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, value := top.Content[i], top.Content[i+1]
		flow(key)
		flow(value)
		for _, part := range split(value) {
			out, err := yaml.Marshal(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{key, part}})
			require.NoError(tb, err)
			if key.Value == "workers" {
				sections = append(sections, string(out))
			} else {
				sections = append(sections, minimal+string(out))
			}
		}
	}
	return sections
}

// split returns a mapping one key at a time and a sequence one item at a time, each
// still a mapping or a sequence; any other node as it is.
func split(n *yaml.Node) []*yaml.Node {
	var parts []*yaml.Node
	switch {
	case n.Kind == yaml.MappingNode && len(n.Content) > 2:
		for i := 0; i+1 < len(n.Content); i += 2 {
			parts = append(parts, &yaml.Node{Kind: n.Kind, Style: n.Style, Content: n.Content[i : i+2]})
		}
	case n.Kind == yaml.SequenceNode && len(n.Content) > 1:
		for _, item := range n.Content {
			parts = append(parts, &yaml.Node{Kind: n.Kind, Style: n.Style, Content: []*yaml.Node{item}})
		}
	default:
		parts = append(parts, n)
	}
	return parts
}

// flow drops n's comments and sets it, and everything under it, in flow style.
func flow(n *yaml.Node) {
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
	for _, c := range n.Content {
		flow(c)
	}
}

// TestValidateReadsAWorkersFileWithTheConfigsAdapters: a workers file's entries are the
// config's worker entries, checked against the config's lora_adapters: a worker's own
// lora_adapters naming a declared adapter is valid, and a worker listing an adapter as
// a model is refused, naming the file and the key, by validate as by the start.
func TestValidateReadsAWorkersFileWithTheConfigsAdapters(t *testing.T) {
	tests := []struct {
		name, workers string
		code          int
		want          string
	}{
		{"a worker serving a declared adapter", "workers: [{name: a, address: 127.0.0.1:8000, models: [qwen], lora_adapters: [sql]}]\n", 0, "1 workers in"},
		{"a worker listing an adapter as a model", "workers: [{name: a, address: 127.0.0.1:8000, models: [sql]}]\n", 1, `workers[0].models[0]: "sql" is a LoRA adapter`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			workers := filepath.Join(dir, "workers.yaml")
			require.NoError(t, os.WriteFile(workers, []byte(tt.workers), 0o600))
			path := filepath.Join(dir, "kvroute.yaml")
			cfg := "lora_adapters: [{name: sql, base_model: qwen}]\ndiscovery: {source: file, file: {path: " + workers + "}}\n"
			require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), []string{"validate", "-config", path}, &out, &errOut), errOut.String())
			assert.Contains(t, out.String()+errOut.String(), tt.want)
		})
	}
}

// TestValidateChecksDiscoveredWorkersAgainstTheBlockSize: an offload_block_size that is
// not whole blocks, in the kubernetes kv_events template or a workers file, makes every
// worker it gives one the fleet refuses: validate says so, as the start does, rather
// than a kvroute that never becomes ready (kubernetes) or does not start (file).
func TestValidateChecksDiscoveredWorkersAgainstTheBlockSize(t *testing.T) {
	dir := t.TempDir()
	workers := filepath.Join(dir, "workers.yaml")
	require.NoError(t, os.WriteFile(workers, []byte(
		"workers: [{name: a, address: 127.0.0.1:8000, models: [qwen], kv_events: {endpoint: \"tcp://{ip}:5557\", offload_block_size: 24}}]\n"), 0o600))
	tests := []struct{ name, discovery, want string }{
		{"the kubernetes kv_events template",
			"discovery: {source: kubernetes, kubernetes: {pool: p, namespace: llm, models: [qwen], kv_events: {endpoint: \"tcp://{ip}:5557\", offload_block_size: 24}}}\n",
			"discovery.kubernetes.kv_events.offload_block_size: must be a multiple of block_size (16), got 24"},
		{"a workers file", "discovery: {source: file, file: {path: " + workers + "}}\n",
			"workers[0].kv_events.offload_block_size: must be a multiple of block_size (16), got 24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kvroute.yaml")
			require.NoError(t, os.WriteFile(path, []byte("block_size: 16\n"+tt.discovery), 0o600))
			var out, errOut bytes.Buffer
			assert.Equal(t, 1, run(context.Background(), []string{"validate", "-config", path}, &out, &errOut), out.String())
			assert.Contains(t, errOut.String(), tt.want)
		})
	}
}
