package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/router"
)

// pod returns a pod of the pool (label app=vllm), Running and Ready at ip.
func pod(name, ip string, edits ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, e := range edits {
		e(p)
	}
	return p
}

func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }
func pending(p *corev1.Pod)  { p.Status.Phase = corev1.PodPending }
func noIP(p *corev1.Pod)     { p.Status.PodIP = "" }
func terminating(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
}
func annotated(v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Annotations = map[string]string{"kvroute.io/models": v} }
}
func labelled(app string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels = map[string]string{"app": app} }
}
func role(v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Labels[RoleLabel] = v }
}

func spec(ports ...int32) InferencePoolSpec {
	s := InferencePoolSpec{Selector: LabelSelector{MatchLabels: map[string]string{"app": "vllm"}}}
	for _, p := range ports {
		s.TargetPorts = append(s.TargetPorts, Port{Number: p})
	}
	return s
}

func withAppProtocol(s InferencePoolSpec, appProtocol string) InferencePoolSpec {
	s.AppProtocol = appProtocol
	return s
}

func h2c(s InferencePoolSpec) InferencePoolSpec { return withAppProtocol(s, "kubernetes.io/h2c") }

func TestWorkersFromPods(t *testing.T) {
	cfg := discovery.KubernetesConfig{Pool: "p", ModelsAnnotation: "kvroute.io/models", Models: []string{"default-model"}}
	tests := []struct {
		name        string
		spec        InferencePoolSpec
		pods        []*corev1.Pod
		want        []router.Worker
		wantSkipped []string
	}{
		{"one port: named after the pod, sorted by name", spec(8000),
			[]*corev1.Pod{pod("vllm-b", "10.0.0.2"), pod("vllm-a", "10.0.0.1")},
			[]router.Worker{
				{Name: "vllm-a", Address: "10.0.0.1:8000", Models: []string{"default-model"}},
				{Name: "vllm-b", Address: "10.0.0.2:8000", Models: []string{"default-model"}},
			}, nil},
		{"several ports: one worker per port, named pod:port", spec(8000, 8001),
			[]*corev1.Pod{pod("vllm-a", "10.0.0.1")},
			[]router.Worker{
				{Name: "vllm-a:8000", Address: "10.0.0.1:8000", Models: []string{"default-model"}},
				{Name: "vllm-a:8001", Address: "10.0.0.1:8001", Models: []string{"default-model"}},
			}, nil},
		{"IPv6 pod", spec(8000), []*corev1.Pod{pod("v6", "fd00::1")},
			[]router.Worker{{Name: "v6", Address: "[fd00::1]:8000", Models: []string{"default-model"}}}, nil},
		{"only Running, Ready pods with an IP that are not terminating", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", notReady), pod("b", "10.0.0.2", pending), pod("c", "", noIP),
				pod("d", "10.0.0.4", terminating), pod("e", "10.0.0.5")},
			[]router.Worker{{Name: "e", Address: "10.0.0.5:8000", Models: []string{"default-model"}}},
			[]string{"a: not ready", "b: phase Pending", `c: no usable pod IP ("")`, "d: terminating"}},
		{"pods the selector does not match are not mentioned", spec(8000),
			[]*corev1.Pod{pod("other", "10.0.0.9", labelled("web"))}, nil, nil},
		{"models from the annotation, trimmed", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", annotated(" Qwen/Qwen3-8B , lora-1,"))},
			[]router.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"Qwen/Qwen3-8B", "lora-1"}}}, nil},
		{"an annotation naming no model leaves the pod out", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", annotated(" , "))}, nil,
			[]string{`a: annotation kvroute.io/models: lists no model (" , ")`}},
		{"two pods at one address (host network): the first keeps it", spec(8000),
			[]*corev1.Pod{pod("b", "10.0.0.1"), pod("a", "10.0.0.1")},
			[]router.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"default-model"}}},
			[]string{"b: address 10.0.0.1:8000 already belongs to worker a"}},
		{"llm-d's role label gives the worker's role; absent, none", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", role("prefill")), pod("b", "10.0.0.2", role("decode")),
				pod("c", "10.0.0.3", role("both")), pod("d", "10.0.0.4")},
			[]router.Worker{
				{Name: "a", Address: "10.0.0.1:8000", Models: []string{"default-model"}, Role: router.RolePrefill},
				{Name: "b", Address: "10.0.0.2:8000", Models: []string{"default-model"}, Role: router.RoleDecode},
				{Name: "c", Address: "10.0.0.3:8000", Models: []string{"default-model"}, Role: router.RoleBoth},
				{Name: "d", Address: "10.0.0.4:8000", Models: []string{"default-model"}},
			}, nil},
		{"a role kvroute does not know leaves the pod out, naming the label", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", role("encode")), pod("b", "10.0.0.2", role("decode"))},
			[]router.Worker{{Name: "b", Address: "10.0.0.2:8000", Models: []string{"default-model"}, Role: router.RoleDecode}},
			[]string{`a: label llm-d.ai/role: "encode" is not prefill, decode, prefill-decode or both`}},
		{"an h2c pool's workers speak h2c", h2c(spec(8000, 8001)),
			[]*corev1.Pod{pod("a", "10.0.0.1")},
			[]router.Worker{
				{Name: "a:8000", Address: "10.0.0.1:8000", Models: []string{"default-model"}, Protocol: router.ProtocolH2C},
				{Name: "a:8001", Address: "10.0.0.1:8001", Models: []string{"default-model"}, Protocol: router.ProtocolH2C},
			}, nil},
		{"an http pool's workers speak HTTP/1.1, as without an appProtocol", withAppProtocol(spec(8000), "http"),
			[]*corev1.Pod{pod("a", "10.0.0.1")},
			[]router.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"default-model"}}}, nil},
		{"llm-d's newer role values: prefill-decode (both's replacement) and the encode-* roles", spec(8000),
			[]*corev1.Pod{pod("a", "10.0.0.1", role("prefill-decode")), pod("b", "10.0.0.2", role("encode-prefill")),
				pod("c", "10.0.0.3", role("encode-prefill-decode"))},
			[]router.Worker{
				{Name: "a", Address: "10.0.0.1:8000", Models: []string{"default-model"}, Role: router.RoleBoth},
				{Name: "b", Address: "10.0.0.2:8000", Models: []string{"default-model"}, Role: router.RolePrefill},
				{Name: "c", Address: "10.0.0.3:8000", Models: []string{"default-model"}, Role: router.RoleBoth},
			}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, skipped := Workers(tt.spec, tt.pods, cfg, nil)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantSkipped, skipped)
			require.NoError(t, router.Config{BlockSize: 1, Workers: got}.Validate(), "a set the fleet accepts")
		})
	}
}

func TestWorkersLeaveOutAPodAnnotatedWithALoRAAdapter(t *testing.T) {
	cfg := discovery.KubernetesConfig{Pool: "p", ModelsAnnotation: "kvroute.io/models"}
	adapters := []router.LoRAAdapter{{Name: "qwen-lora", BaseModel: "qwen"}}
	got, skipped := Workers(spec(8000), []*corev1.Pod{
		pod("a", "10.0.0.1", annotated("qwen")), pod("b", "10.0.0.2", annotated("qwen, qwen-lora")),
	}, cfg, adapters)
	assert.Equal(t, []router.Worker{{Name: "a", Address: "10.0.0.1:8000", Models: []string{"qwen"}}}, got)
	assert.Equal(t, []string{`b: annotation kvroute.io/models: "qwen-lora" is a LoRA adapter (lora_adapters): list its base model "qwen"`}, skipped)
	require.NoError(t, router.Config{BlockSize: 1, Workers: got, LoRAAdapters: adapters}.Validate(), "a set the fleet accepts")
}

func TestParseModelsIsBounded(t *testing.T) {
	many := ""
	for range maxModels + 1 {
		many += "m,"
	}
	_, err := parseModels(many)
	assert.ErrorContains(t, err, "more than 64 models")
	_, err = parseModels(string(make([]byte, maxModelLength+1)))
	assert.ErrorContains(t, err, "longer than")
}

func TestPoolSpecValidate(t *testing.T) {
	ref := func(r EndpointPickerRef) InferencePoolSpec { s := spec(8000); s.EndpointPickerRef = &r; return s }
	tests := []struct {
		name    string
		spec    InferencePoolSpec
		wantErr string
	}{
		{"minimal", spec(8000), ""},
		{"with a picker", ref(EndpointPickerRef{Name: "kvroute", Port: &Port{Number: 9002}, FailureMode: "FailClose"}), ""},
		{"empty selector", InferencePoolSpec{TargetPorts: []Port{{Number: 1}}}, "spec.selector.matchLabels: empty"},
		{"bad label value", InferencePoolSpec{Selector: LabelSelector{MatchLabels: map[string]string{"app": "a/b"}}, TargetPorts: []Port{{Number: 1}}}, "spec.selector.matchLabels[app]"},
		{"no ports", spec(), "spec.targetPorts: must list 1 to 8"},
		{"nine ports", spec(1, 2, 3, 4, 5, 6, 7, 8, 9), "spec.targetPorts: must list 1 to 8"},
		{"port out of range", spec(70000), "spec.targetPorts[0].number"},
		{"port twice", spec(8000, 8000), "spec.targetPorts[1].number: port 8000 listed twice"},
		{"bad app protocol", func() InferencePoolSpec { s := spec(1); s.AppProtocol = "grpc"; return s }(), "spec.appProtocol"},
		{"picker without a name", ref(EndpointPickerRef{Port: &Port{Number: 9002}}), "spec.endpointPickerRef.name"},
		{"Service picker without a port", ref(EndpointPickerRef{Name: "kvroute"}), "spec.endpointPickerRef.port: required"},
		{"bad failure mode", ref(EndpointPickerRef{Name: "k", Port: &Port{Number: 1}, FailureMode: "Open"}), "spec.endpointPickerRef.failureMode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestWorkersGetTheKVEventsTemplate(t *testing.T) {
	events := &router.KVEvents{Endpoint: "tcp://{ip}:5557", ReplayEndpoint: "tcp://{ip}:5558"}
	cfg := discovery.KubernetesConfig{Pool: "p", ModelsAnnotation: "kvroute.io/models", Models: []string{"qwen"}, KVEvents: events}
	workers, skipped := Workers(spec(8000), []*corev1.Pod{
		pod("vllm-a", "10.0.0.1"),
		pod("vllm-b", "10.0.0.2", annotated("qwen,llama")), // events cannot say which model a block is for
	}, cfg, nil)
	require.Len(t, workers, 1)
	assert.Equal(t, "vllm-a", workers[0].Name)
	require.NotNil(t, workers[0].KVEvents)
	assert.NotSame(t, events, workers[0].KVEvents, "each worker owns its copy")
	streams, err := workers[0].KVEvents.Resolve(workers[0].Address)
	require.NoError(t, err)
	assert.Equal(t, []string{"tcp://10.0.0.1:5557"}, streams.Endpoints, "{ip} is the pod's IP")
	require.Len(t, skipped, 1)
	assert.Contains(t, skipped[0], "vllm-b")
	assert.Contains(t, skipped[0], "exactly one model")
}

// TestEachPortOfAPodSubscribesToItsRanksEvents: a pod serving data-parallel ranks on
// several target ports (one worker per port) gets, from one template, each rank's own
// event and replay ports, as vLLM offsets them by rank; before, every port's worker
// subscribed to rank 0's stream and was credited with its blocks.
func TestEachPortOfAPodSubscribesToItsRanksEvents(t *testing.T) {
	events := &router.KVEvents{Endpoint: "tcp://{ip}:5557", ReplayEndpoint: "tcp://{ip}:6557"}
	cfg := discovery.KubernetesConfig{Pool: "p", Models: []string{"qwen"}, KVEvents: events}
	tests := []struct {
		name  string
		ports []int32
		want  map[string][2]string // worker → its endpoint and replay endpoint
	}{
		{"one port", []int32{8000}, map[string][2]string{"vllm-a": {"tcp://10.0.0.1:5557", "tcp://10.0.0.1:6557"}}},
		{"ranks on three ports, listed out of order", []int32{8002, 8000, 8001}, map[string][2]string{
			"vllm-a:8000": {"tcp://10.0.0.1:5557", "tcp://10.0.0.1:6557"},
			"vllm-a:8001": {"tcp://10.0.0.1:5558", "tcp://10.0.0.1:6558"},
			"vllm-a:8002": {"tcp://10.0.0.1:5559", "tcp://10.0.0.1:6559"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			workers, skipped := Workers(spec(tt.ports...), []*corev1.Pod{pod("vllm-a", "10.0.0.1")}, cfg, nil)
			require.Empty(t, skipped)
			got := map[string][2]string{}
			for _, w := range workers {
				streams, err := w.KVEvents.Resolve(w.Address)
				require.NoError(t, err)
				require.Len(t, streams.Endpoints, 1)
				got[w.Name] = [2]string{streams.Endpoints[0], streams.Replay[0]}
			}
			assert.Equal(t, tt.want, got)
		})
	}
	assert.Zero(t, events.FirstRank, "the template itself is not changed")

	// Each port fronting two ranks: port 8001's worker follows ranks 2 and 3.
	two := &router.KVEvents{Endpoint: "tcp://{ip}:5557", DataParallelSize: 2}
	workers, skipped := Workers(spec(8000, 8001), []*corev1.Pod{pod("vllm-a", "10.0.0.1")},
		discovery.KubernetesConfig{Pool: "p", Models: []string{"qwen"}, KVEvents: two}, nil)
	require.Empty(t, skipped)
	require.Len(t, workers, 2)
	streams, err := workers[1].KVEvents.Resolve(workers[1].Address)
	require.NoError(t, err)
	assert.Equal(t, []string{"tcp://10.0.0.1:5559", "tcp://10.0.0.1:5560"}, streams.Endpoints)
}
