package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

func TestConfigValidateNamesTheKey(t *testing.T) {
	kube := func(k KubernetesConfig) Config { return Config{Source: SourceKubernetes, Kubernetes: k} }
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"default is static", DefaultConfig(), ""},
		{"file with a path", Config{Source: SourceFile, File: FileConfig{Path: "/etc/kvroute/workers.yaml"}}, ""},
		{"kubernetes with every key", kube(KubernetesConfig{Pool: "qwen-pool", Namespace: "llm", Kubeconfig: "/k", ModelsAnnotation: "kvroute.io/models", Models: []string{"Qwen/Qwen3-8B"}}), ""},
		{"unknown source", Config{Source: "consul"}, "discovery.source: must be static, file or kubernetes"},
		{"empty source", Config{}, "discovery.source"},
		{"file without a path", Config{Source: SourceFile}, "discovery.file.path: required"},
		{"file keys under static", Config{Source: SourceStatic, File: FileConfig{Path: "x"}}, "discovery.file: set, but discovery.source is static"},
		{"kubernetes keys under file", Config{Source: SourceFile, File: FileConfig{Path: "x"}, Kubernetes: KubernetesConfig{Pool: "p"}}, "discovery.kubernetes: set, but discovery.source is file"},
		{"kubernetes without a pool", kube(KubernetesConfig{}), "discovery.kubernetes.pool: required"},
		{"pool not an object name", kube(KubernetesConfig{Pool: "Qwen_Pool"}), "discovery.kubernetes.pool"},
		{"namespace not a label", kube(KubernetesConfig{Pool: "p", Namespace: "a.b"}), "discovery.kubernetes.namespace"},
		{"annotation key with two slashes", kube(KubernetesConfig{Pool: "p", ModelsAnnotation: "a/b/c"}), "discovery.kubernetes.models_annotation"},
		{"empty model", kube(KubernetesConfig{Pool: "p", Models: []string{"m", ""}}), "discovery.kubernetes.models[1]"},
		{"kv_events template with one model", kube(KubernetesConfig{Pool: "p", Models: []string{"m"}, KVEvents: &router.KVEvents{Endpoint: "tcp://{ip}:5557"}}), ""},
		{"kv_events template, models from the annotation", kube(KubernetesConfig{Pool: "p", ModelsAnnotation: "kvroute.io/models", KVEvents: &router.KVEvents{Endpoint: "tcp://{ip}:5557"}}), ""},
		{"kv_events without an endpoint", kube(KubernetesConfig{Pool: "p", Models: []string{"m"}, KVEvents: &router.KVEvents{}}), "discovery.kubernetes.kv_events.endpoint"},
		{"kv_events for pods of every model", kube(KubernetesConfig{Pool: "p", KVEvents: &router.KVEvents{Endpoint: "tcp://{ip}:5557"}}), "exactly one model"},
		{"kv_events under static", Config{Source: SourceStatic, Kubernetes: KubernetesConfig{KVEvents: &router.KVEvents{Endpoint: "x"}}}, "discovery.kubernetes: set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestCheckWorkersStaticNeedsThemOthersForbidThem(t *testing.T) {
	file := Config{Source: SourceFile, File: FileConfig{Path: "w.yaml"}}
	kube := Config{Source: SourceKubernetes, Kubernetes: KubernetesConfig{Pool: "p"}}
	assert.ErrorIs(t, DefaultConfig().CheckWorkers(0), ErrWorkersRequired)
	assert.NoError(t, DefaultConfig().CheckWorkers(2))
	assert.NoError(t, file.CheckWorkers(0))
	assert.ErrorIs(t, file.CheckWorkers(1), ErrWorkersNotAllowed)
	assert.ErrorContains(t, file.CheckWorkers(1), "discovery.file.path")
	assert.ErrorIs(t, kube.CheckWorkers(3), ErrWorkersNotAllowed)
	assert.ErrorContains(t, kube.CheckWorkers(3), "InferencePool")
}
