package kube

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// NewClients builds API clients from a kubeconfig file, or, when kubeconfig is empty,
// from the in-cluster service account. Errors name the config key.
func NewClients(kubeconfig string) (*Clients, error) {
	var cfg *rest.Config
	var namespace string
	if kubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		var err error
		if cfg, err = loader.ClientConfig(); err != nil {
			return nil, fmt.Errorf("discovery.kubernetes.kubeconfig: %w", err)
		}
		if namespace, _, err = loader.Namespace(); err != nil {
			return nil, fmt.Errorf("discovery.kubernetes.kubeconfig: %w", err)
		}
	} else {
		var err error
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("discovery.kubernetes: not in a cluster (%w): set discovery.kubernetes.kubeconfig to run outside one", err)
		}
		if raw, err := os.ReadFile(serviceAccountNamespace); err == nil {
			namespace = strings.TrimSpace(string(raw))
		}
	}
	cfg.UserAgent = "kvroute"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	// Pods travel as protobuf, lighter on the API server than JSON; custom resources
	// (the pool) only have JSON.
	protoCfg := rest.CopyConfig(cfg)
	protoCfg.ContentType = "application/vnd.kubernetes.protobuf"
	protoCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	core, err := kubernetes.NewForConfig(protoCfg)
	if err != nil {
		return nil, fmt.Errorf("discovery.kubernetes: %w", err)
	}
	return &Clients{Core: core, Dynamic: dyn, Namespace: namespace}, nil
}
