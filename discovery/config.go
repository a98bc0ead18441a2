package discovery

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/kvroute/kvroute/router"
)

// Source names, the values of `discovery.source`.
const (
	SourceStatic     = "static"
	SourceFile       = "file"
	SourceKubernetes = "kubernetes"
)

// Config is the `discovery` section of kvroute's config.
type Config struct {
	// Source is where workers come from: static (the config's `workers`), file, or
	// kubernetes.
	Source     string           `yaml:"source" json:"source"`
	File       FileConfig       `yaml:"file" json:"file"`
	Kubernetes KubernetesConfig `yaml:"kubernetes" json:"kubernetes"`
}

// FileConfig is `discovery.file`.
type FileConfig struct {
	// Path is a YAML file holding `workers:`, the same entries as the config's list.
	Path string `yaml:"path" json:"path"`
}

// KubernetesConfig is `discovery.kubernetes`.
type KubernetesConfig struct {
	// Pool names the InferencePool (inference.networking.k8s.io/v1) whose pods are the
	// workers.
	Pool string `yaml:"pool" json:"pool"`
	// Namespace is the pool's and its pods' namespace; empty means kvroute's own (the
	// service account's, in a cluster) or the kubeconfig context's.
	Namespace string `yaml:"namespace" json:"namespace"`
	// Kubeconfig is a kubeconfig file for running outside the cluster; empty means the
	// in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig" json:"kubeconfig"`
	// ModelsAnnotation names a pod annotation listing the models the pod serves,
	// comma-separated (an annotation, because label values cannot hold "/"). A pod
	// without it serves Models.
	ModelsAnnotation string `yaml:"models_annotation" json:"models_annotation"`
	// Models are the models of a pod without the annotation; empty means every model.
	Models []string `yaml:"models" json:"models"`
	// KVEvents, when set, is every discovered worker's kv_events, a template: `{ip}`
	// in its endpoints is the pod's IP (README "KV events"). An event-mode worker
	// serves exactly one model, so a pod listing several is left out.
	KVEvents *router.KVEvents `yaml:"kv_events" json:"kv_events,omitempty"`
}

// DefaultConfig is the static source: the config's own `workers`.
func DefaultConfig() Config { return Config{Source: SourceStatic} }

// Kubernetes object names: DNS-1123 subdomains (pools) and labels (namespaces).
var (
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	// An annotation key: an optional DNS-subdomain prefix and "/", then a name.
	annotationKey = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

// Validate reports the first invalid field, naming its YAML path. Keys of a source
// other than the one chosen are errors: they would be silently ignored.
func (c Config) Validate() error {
	switch c.Source {
	case SourceStatic, SourceFile, SourceKubernetes:
	default:
		return fmt.Errorf("discovery.source: must be %s, %s or %s, got %q", SourceStatic, SourceFile, SourceKubernetes, c.Source)
	}
	if c.Source != SourceFile && c.File != (FileConfig{}) {
		return fmt.Errorf("discovery.file: set, but discovery.source is %s", c.Source)
	}
	k := c.Kubernetes
	if c.Source != SourceKubernetes && (k.Pool != "" || k.Namespace != "" || k.Kubeconfig != "" || k.ModelsAnnotation != "" || len(k.Models) > 0 || k.KVEvents != nil) {
		return fmt.Errorf("discovery.kubernetes: set, but discovery.source is %s", c.Source)
	}
	switch c.Source {
	case SourceFile:
		if strings.TrimSpace(c.File.Path) == "" {
			return errors.New("discovery.file.path: required with discovery.source file")
		}
	case SourceKubernetes:
		return k.validate()
	}
	return nil
}

func (k KubernetesConfig) validate() error {
	if k.Pool == "" {
		return errors.New("discovery.kubernetes.pool: required with discovery.source kubernetes (the InferencePool's name)")
	}
	if len(k.Pool) > 253 || !dnsSubdomain.MatchString(k.Pool) {
		return fmt.Errorf("discovery.kubernetes.pool: %q is not a Kubernetes object name (lower-case DNS subdomain)", k.Pool)
	}
	if k.Namespace != "" && (len(k.Namespace) > 63 || !dnsLabel.MatchString(k.Namespace)) {
		return fmt.Errorf("discovery.kubernetes.namespace: %q is not a Kubernetes namespace name (lower-case DNS label)", k.Namespace)
	}
	if k.ModelsAnnotation != "" && (len(k.ModelsAnnotation) > 316 || !annotationKey.MatchString(k.ModelsAnnotation)) {
		return fmt.Errorf("discovery.kubernetes.models_annotation: %q is not an annotation key (prefix/name)", k.ModelsAnnotation)
	}
	for i, m := range k.Models {
		if m == "" {
			return fmt.Errorf("discovery.kubernetes.models[%d]: must not be empty", i)
		}
	}
	if k.KVEvents != nil {
		// Checked on a stand-in pod; the model rule is checked again on each real pod,
		// whose annotation may name its models.
		example := router.Worker{Address: "192.0.2.1:8000", Models: k.Models, KVEvents: k.KVEvents}
		if k.ModelsAnnotation != "" {
			example.Models = []string{"annotated-model"}
		}
		return example.ValidateKVEvents("discovery.kubernetes")
	}
	return nil
}

// CheckBlockSize reports what blockSize, the config's block_size, makes invalid here:
// a kubernetes kv_events template whose offload_block_size is not whole blocks would
// give workers the fleet refuses, every one of them, so no pod would ever be a worker.
func (c Config) CheckBlockSize(blockSize int) error {
	k := c.Kubernetes.KVEvents
	if c.Source == SourceKubernetes && k != nil && k.OffloadBlockSize > 0 && blockSize > 0 && k.OffloadBlockSize%blockSize != 0 {
		return fmt.Errorf("discovery.kubernetes.kv_events.offload_block_size: must be a multiple of block_size (%d), got %d", blockSize, k.OffloadBlockSize)
	}
	return nil
}

// Errors about the config's `workers` list, which only the static source reads.
var (
	ErrWorkersRequired   = errors.New("workers: at least one worker is required with discovery.source static")
	ErrWorkersNotAllowed = errors.New("workers: must be absent unless discovery.source is static")
)

// CheckWorkers reports whether the config's `workers` list, of n entries, suits the
// source: required for static, absent otherwise (discovered workers would silently
// replace it).
func (c Config) CheckWorkers(n int) error {
	switch {
	case c.Source == SourceStatic && n == 0:
		return ErrWorkersRequired
	case c.Source != SourceStatic && n > 0:
		return fmt.Errorf("%w (it is %s: the workers come from %s)", ErrWorkersNotAllowed, c.Source, c.from())
	}
	return nil
}

func (c Config) from() string {
	if c.Source == SourceFile {
		return "discovery.file.path"
	}
	return "the InferencePool discovery.kubernetes.pool"
}
