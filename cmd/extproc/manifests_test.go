package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery/kube"
)

// manifestTypes maps apiVersion/kind to the Go type a manifest must decode into. GIE's
// API module is not served by the Go module proxy: InferencePool decodes into kvroute's
// own type of its v1 fields, and its spec is then checked as the CRD's schema does.
var manifestTypes = map[string]func() any{
	"v1/Namespace":                                 func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                            func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                                 func() any { return &corev1.ConfigMap{} },
	"v1/Service":                                   func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                           func() any { return &appsv1.Deployment{} },
	"rbac.authorization.k8s.io/v1/Role":            func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":     func() any { return &rbacv1.RoleBinding{} },
	"inference.networking.k8s.io/v1/InferencePool": func() any { return &kube.InferencePool{} },
	"inference.networking.x-k8s.io/v1alpha2/InferenceObjective": func() any { return &kube.InferenceObjective{} },
	"gateway.networking.k8s.io/v1/Gateway":                      func() any { return &gatewayv1.Gateway{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":                    func() any { return &gatewayv1.HTTPRoute{} },
}

// decodeManifests decodes every YAML document strictly into its API type: duplicate
// keys, unknown fields and unknown kinds are errors.
func decodeManifests(raw []byte) ([]any, error) {
	var out []any
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for i := 0; ; i++ {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if doc == nil {
			continue
		}
		key := fmt.Sprintf("%v/%v", doc["apiVersion"], doc["kind"])
		newType, ok := manifestTypes[key]
		if !ok {
			return nil, fmt.Errorf("document %d: no API type known for %s", i, key)
		}
		js, err := json.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, key, err)
		}
		obj := newType()
		strict := json.NewDecoder(bytes.NewReader(js))
		strict.DisallowUnknownFields()
		if err := strict.Decode(obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, key, err)
		}
		out = append(out, obj)
	}
}

func TestManifestDecodingIsStrict(t *testing.T) {
	for name, raw := range map[string]string{
		"unknown field":    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n",
		"duplicate key":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown kind":     "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
		"wrong type":       "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: grpc}]}\n",
		"pool field typo":  "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {targetPort: [{number: 1}]}\n",
		"route field typo": "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rules: [{backendRef: []}]}\n",
	} {
		_, err := decodeManifests([]byte(raw))
		assert.Error(t, err, name)
	}
}

// example is the Kubernetes example, decoded.
type example struct {
	namespaces      []*corev1.Namespace
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	serviceAccounts map[string]*corev1.ServiceAccount
	roles           map[string]*rbacv1.Role
	bindings        map[string]*rbacv1.RoleBinding
	pools           map[string]*kube.InferencePool
	objectives      map[string]*kube.InferenceObjective
	gateways        map[string]*gatewayv1.Gateway
	routes          map[string]*gatewayv1.HTTPRoute
	// placed says which namespace each namespaced object is in, by kind/name.
	placed map[string]string
}

func loadExample(t *testing.T) example {
	t.Helper()
	files, err := filepath.Glob("../../examples/kubernetes/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	ex := example{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, serviceAccounts: map[string]*corev1.ServiceAccount{},
		roles: map[string]*rbacv1.Role{}, bindings: map[string]*rbacv1.RoleBinding{}, pools: map[string]*kube.InferencePool{},
		objectives: map[string]*kube.InferenceObjective{},
		gateways:   map[string]*gatewayv1.Gateway{}, routes: map[string]*gatewayv1.HTTPRoute{}, placed: map[string]string{}}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		objs, err := decodeManifests(raw)
		require.NoError(t, err, file)
		for _, obj := range objs {
			if o, ok := obj.(metav1.Object); ok {
				if _, isNamespace := obj.(*corev1.Namespace); !isNamespace {
					ex.placed[fmt.Sprintf("%T/%s", obj, o.GetName())] = o.GetNamespace()
				}
			}
			switch o := obj.(type) {
			case *corev1.Namespace:
				ex.namespaces = append(ex.namespaces, o)
			case *appsv1.Deployment:
				ex.deployments[o.Name] = o
			case *corev1.Service:
				ex.services[o.Name] = o
			case *corev1.ConfigMap:
				ex.configMaps[o.Name] = o
			case *corev1.ServiceAccount:
				ex.serviceAccounts[o.Name] = o
			case *rbacv1.Role:
				ex.roles[o.Name] = o
			case *rbacv1.RoleBinding:
				ex.bindings[o.Name] = o
			case *kube.InferencePool:
				require.NoError(t, o.Spec.Validate(), "InferencePool %s", o.Name)
				ex.pools[o.Name] = o
			case *kube.InferenceObjective:
				ex.objectives[o.Name] = o
			case *gatewayv1.Gateway:
				ex.gateways[o.Name] = o
			case *gatewayv1.HTTPRoute:
				ex.routes[o.Name] = o
			}
		}
	}
	return ex
}

func container(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	require.Len(t, d.Spec.Template.Spec.Containers, 1, d.Name)
	return d.Spec.Template.Spec.Containers[0]
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// The example's config validates through the real command, and every manifest agrees
// with the others: what the pool selects is the vLLM Deployment, its picker is
// kvroute's Service, the probes ask the services kvroute serves, and the RBAC grants
// exactly what discovery reads.
func TestKubernetesExample(t *testing.T) {
	ex := loadExample(t)
	require.Len(t, ex.namespaces, 1)
	ns := ex.namespaces[0].Name

	// The ConfigMap's config, through `extproc validate`.
	cm := ex.configMaps["kvroute"]
	require.NotNil(t, cm)
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	require.NoError(t, os.WriteFile(path, []byte(cm.Data["kvroute.yaml"]), 0o600))
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"validate", "-config", path}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "workers from InferencePool qwen3-8b in llm")
	assert.Contains(t, out.String(), "peers from DNS kvroute-peers.llm.svc.cluster.local:9090, changes sent within 10ms")
	cfg, err := config.Load(path)
	require.NoError(t, err)

	pool := ex.pools[cfg.Discovery.Kubernetes.Pool]
	require.NotNil(t, pool, "the config names the example's pool")
	assert.Equal(t, ns, pool.Namespace)
	assert.Equal(t, ns, cfg.Discovery.Kubernetes.Namespace)

	// The pool selects the vLLM pods on their serving port.
	vllm := ex.deployments["vllm-qwen3-8b"]
	require.NotNil(t, vllm)
	assert.True(t, labels.SelectorFromSet(pool.Spec.Selector.MatchLabels).Matches(labels.Set(vllm.Spec.Template.Labels)))
	server := container(t, vllm)
	assert.Equal(t, pool.Spec.TargetPorts[0].Number, containerPort(server, "http"))
	args := strings.Join(server.Args, " ")
	assert.Contains(t, args, "--enable-prefix-caching")
	assert.Contains(t, args, fmt.Sprintf("--block-size=%d ", cfg.Router.BlockSize), "kvroute's block_size is the engine's")
	assert.Contains(t, vllm.Spec.Template.Annotations, cfg.Discovery.Kubernetes.ModelsAnnotation, "the pods carry the models annotation")
	var kvEvents struct {
		Enable   bool   `json:"enable_kv_cache_events"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
	}
	for _, a := range server.Args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			require.NoError(t, json.Unmarshal([]byte(v), &kvEvents), "--kv-events-config is JSON")
		}
	}
	assert.True(t, kvEvents.Enable, "KV events on")
	assert.Equal(t, "tcp://*:5557", kvEvents.Endpoint)
	// kvroute subscribes to every discovered pod's stream, on the ports vLLM binds.
	events := cfg.Discovery.Kubernetes.KVEvents
	require.NotNil(t, events, "discovery.kubernetes.kv_events is set")
	assert.Equal(t, strings.Replace(kvEvents.Endpoint, "*", "{ip}", 1), events.Endpoint)
	assert.Equal(t, strings.Replace(kvEvents.Replay, "*", "{ip}", 1), events.ReplayEndpoint)

	// The pool's picker is kvroute's Service, speaking h2c on the port kvroute serves.
	ref := pool.Spec.EndpointPickerRef
	require.NotNil(t, ref)
	svc := ex.services[ref.Name]
	require.NotNil(t, svc, "endpointPickerRef names a Service of the example")
	var grpcPort *corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		if p.Port == ref.Port.Number {
			grpcPort = &svc.Spec.Ports[i]
		}
	}
	require.NotNil(t, grpcPort, "the Service has the picker's port")
	require.NotNil(t, grpcPort.AppProtocol)
	assert.Equal(t, "kubernetes.io/h2c", *grpcPort.AppProtocol)
	kvroute := ex.deployments["kvroute"]
	require.NotNil(t, kvroute)
	assert.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(kvroute.Spec.Template.Labels)))
	c := container(t, kvroute)
	_, listenPort, err := net.SplitHostPort(cfg.GRPCAddress)
	require.NoError(t, err)
	assert.Equal(t, listenPort, fmt.Sprint(containerPort(c, grpcPort.TargetPort.StrVal)), "the Service reaches grpc_address")
	_, adminPort, err := net.SplitHostPort(cfg.AdminAddress)
	require.NoError(t, err)
	assert.Equal(t, adminPort, fmt.Sprint(containerPort(c, "metrics")), "metrics are scraped from admin_address")

	// The replicas find each other through a headless Service of their own pods, on the
	// admin port, where each serves its booked load.
	peerHost, peerPort, err := net.SplitHostPort(cfg.Peers.DNS)
	require.NoError(t, err, "peers.dns is set")
	peerName, _, _ := strings.Cut(peerHost, ".")
	assert.Equal(t, peerName+"."+ns+".svc.cluster.local", peerHost)
	peerSvc := ex.services[peerName]
	require.NotNil(t, peerSvc, "peers.dns names a Service of the example")
	assert.Equal(t, corev1.ClusterIPNone, peerSvc.Spec.ClusterIP, "headless: one address per replica")
	assert.True(t, labels.SelectorFromSet(peerSvc.Spec.Selector).Matches(labels.Set(kvroute.Spec.Template.Labels)))
	require.Len(t, peerSvc.Spec.Ports, 1)
	assert.Equal(t, adminPort, peerPort, "a headless Service's DNS gives pod IPs: the port is the pod's admin port")
	assert.Equal(t, peerPort, fmt.Sprint(peerSvc.Spec.Ports[0].Port))
	assert.Equal(t, adminPort, fmt.Sprint(containerPort(c, peerSvc.Spec.Ports[0].TargetPort.StrVal)), "the peers watch admin_address")

	// kvroute's Deployment: two replicas, probes on the gRPC health services, non-root,
	// resources, its config from the ConfigMap.
	require.NotNil(t, kvroute.Spec.Replicas)
	assert.Equal(t, int32(2), *kvroute.Spec.Replicas)
	for probe, service := range map[*corev1.Probe]string{c.ReadinessProbe: "readiness", c.LivenessProbe: "liveness"} {
		require.NotNil(t, probe)
		require.NotNil(t, probe.GRPC, "a gRPC health probe")
		assert.Equal(t, listenPort, fmt.Sprint(probe.GRPC.Port))
		require.NotNil(t, probe.GRPC.Service)
		assert.Equal(t, service, *probe.GRPC.Service)
	}
	pod := kvroute.Spec.Template.Spec
	require.NotNil(t, pod.SecurityContext.RunAsNonRoot)
	assert.True(t, *pod.SecurityContext.RunAsNonRoot)
	assert.NotZero(t, *pod.SecurityContext.RunAsUser)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.False(t, c.Resources.Requests.Cpu().IsZero())
	assert.False(t, c.Resources.Requests.Memory().IsZero())
	assert.False(t, c.Resources.Limits.Memory().IsZero())
	assert.Greater(t, *pod.TerminationGracePeriodSeconds, int64(cfg.ShutdownGrace.Seconds()), "the drain finishes before the kill")
	require.Len(t, pod.Volumes, 1)
	assert.Equal(t, cm.Name, pod.Volumes[0].ConfigMap.Name)
	assert.Equal(t, []string{"-config", c.VolumeMounts[0].MountPath + "/kvroute.yaml"}, c.Args)

	// RBAC: get, list and watch on pods, inferencepools, and inferenceobjectives and
	// inferencemodelrewrites in both groups kvroute reads them in, in the namespace, for
	// kvroute's service account; nothing more.
	sa := ex.serviceAccounts[pod.ServiceAccountName]
	require.NotNil(t, sa)
	binding := ex.bindings["kvroute"]
	require.NotNil(t, binding)
	assert.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: ns}}, binding.Subjects)
	role := ex.roles[binding.RoleRef.Name]
	require.NotNil(t, role)
	assert.Equal(t, "Role", binding.RoleRef.Kind)
	watch := []string{"get", "list", "watch"}
	assert.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: watch},
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: watch},
		{APIGroups: []string{kube.Group, kube.LegacyGroup}, Resources: []string{kube.ObjectivesResource, kube.ModelRewritesResource}, Verbs: watch},
	}, role.Rules)

	// The objectives give requests their priorities: each names the pool, in its group,
	// one is sheddable, and the config reads the header requests name them in.
	require.NotEmpty(t, ex.objectives)
	sheddable := 0
	for name, o := range ex.objectives {
		assert.Equal(t, pool.Name, o.Spec.PoolRef.Name, name)
		assert.Equal(t, "inference.networking.k8s.io", o.Spec.PoolRef.Group, name)
		require.NotNil(t, o.Spec.Priority, name)
		if *o.Spec.Priority < 0 {
			sheddable++
		}
	}
	assert.Equal(t, 1, sheddable, "the example shows a sheddable objective")
	assert.Equal(t, "x-llm-d-inference-objective", cfg.Priority.Header, "llm-d-router's header, GIE's read after it")

	// The route sends the OpenAI API to the pool, through the example's Gateway.
	route := ex.routes["qwen3-8b"]
	require.NotNil(t, route)
	require.Len(t, route.Spec.Rules, 1)
	backend := route.Spec.Rules[0].BackendRefs[0].BackendObjectReference
	assert.Equal(t, "inference.networking.k8s.io", string(*backend.Group))
	assert.Equal(t, "InferencePool", string(*backend.Kind))
	assert.Equal(t, pool.Name, string(backend.Name))
	assert.Contains(t, ex.gateways, string(route.Spec.ParentRefs[0].Name))

	// Every object is in the example's namespace, where the Role grants its rights.
	assert.Len(t, ex.placed, 13)
	for object, namespace := range ex.placed {
		assert.Equal(t, ns, namespace, object)
	}
}
