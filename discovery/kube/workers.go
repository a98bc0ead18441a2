package kube

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/router"
)

// Bounds on a models annotation: pods are written by whoever may create them in the
// namespace, and what they say becomes candidate lists.
const (
	maxModels      = 64
	maxModelLength = 256
)

// Workers returns the pool's workers among pods, sorted by name, and why pods that
// match the selector were left out (for the log). A pod is a worker while it is
// Running, Ready, not terminating and has an IP; it gives one worker per target port
// (per port its active-ports annotation lists, when it has one), speaking the pool's
// appProtocol (protocolOf).
// adapters are the config's lora_adapters: a pod whose models annotation names one
// is left out, as the fleet would refuse its worker (and with it the whole set).
// The spec must have passed Validate.
func Workers(spec InferencePoolSpec, pods []*corev1.Pod, cfg discovery.KubernetesConfig, adapters []router.LoRAAdapter) ([]router.Worker, []string) {
	selector := labels.SelectorFromSet(spec.Selector.MatchLabels)
	bases := make(map[string]string, len(adapters))
	for _, a := range adapters {
		bases[a.Name] = a.BaseModel
	}
	var workers []router.Worker
	var skipped []string
	addresses := map[string]string{}
	protocol := protocolOf(spec.AppProtocol)
	sorted := slices.Clone(pods)
	slices.SortFunc(sorted, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, pod := range sorted {
		if !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		ip, why := serving(pod)
		if why != "" {
			skipped = append(skipped, pod.Name+": "+why)
			continue
		}
		models := cfg.Models
		if cfg.ModelsAnnotation != "" {
			if value, ok := pod.Annotations[cfg.ModelsAnnotation]; ok {
				var err error
				if models, err = parseModels(value); err != nil {
					skipped = append(skipped, fmt.Sprintf("%s: annotation %s: %v", pod.Name, cfg.ModelsAnnotation, err))
					continue
				}
				if i := slices.IndexFunc(models, func(m string) bool { _, ok := bases[m]; return ok }); i >= 0 {
					skipped = append(skipped, fmt.Sprintf("%s: annotation %s: %q is a LoRA adapter (lora_adapters): list its base model %q",
						pod.Name, cfg.ModelsAnnotation, models[i], bases[models[i]]))
					continue
				}
			}
		}
		role, ok := roleOf(pod.Labels[RoleLabel])
		if !ok {
			skipped = append(skipped, fmt.Sprintf("%s: label %s: %q is not %s, %s, %s or %s", pod.Name, RoleLabel, pod.Labels[RoleLabel],
				router.RolePrefill, router.RoleDecode, rolePrefillDecode, router.RoleBoth))
			continue
		}
		active, annotation := activePorts(pod)
		ranks := portRanks(spec.TargetPorts)
		for _, port := range spec.TargetPorts {
			name := pod.Name
			if len(spec.TargetPorts) > 1 {
				name += ":" + strconv.Itoa(int(port.Number))
			}
			if active != nil && !active[port.Number] {
				skipped = append(skipped, fmt.Sprintf("%s: port %d not in annotation %s", name, port.Number, annotation))
				continue
			}
			address := netip.AddrPortFrom(ip, uint16(port.Number)).String()
			if other, taken := addresses[address]; taken {
				// Two pods at one address (host networking): the address names one
				// engine, so only the first pod's worker routes to it.
				skipped = append(skipped, fmt.Sprintf("%s: address %s already belongs to worker %s", name, address, other))
				continue
			}
			addresses[address] = name
			worker := router.Worker{Name: name, Address: address, Models: slices.Clone(models), Role: role, Protocol: protocol}
			if cfg.KVEvents != nil {
				events := *cfg.KVEvents
				// One template serves every port of the pod: a data-parallel rank's
				// engine publishes on the template's ports offset by its rank, and
				// each port fronts data_parallel_size ranks (1 unless set).
				events.FirstRank = ranks[port.Number] * events.Ranks()
				worker.KVEvents = &events
				if err := worker.ValidateKVEvents(name); err != nil {
					skipped = append(skipped, err.Error())
					continue
				}
			}
			workers = append(workers, worker)
		}
	}
	return workers, skipped
}

// appProtocolH2C is the InferencePool appProtocol of model servers that speak HTTP/2
// over cleartext (Kubernetes' standard application protocol name).
const appProtocolH2C = "kubernetes.io/h2c"

// protocolOf returns the router.Worker.Protocol of a pool's workers from its
// spec.appProtocol: h2c for kubernetes.io/h2c, else "" (HTTP/1.1, the CRD's default
// http). The spec must have passed Validate.
func protocolOf(appProtocol string) string {
	if appProtocol == appProtocolH2C {
		return router.ProtocolH2C
	}
	return ""
}

// portRanks numbers a pool's target ports in ascending order: the data-parallel rank
// served on each when a pod serves its ranks on consecutive ports (llm-d's layout, whose
// active-ports annotation lists the ranks up), and 0 for a pool of one port.
func portRanks(ports []Port) map[int32]int {
	numbers := make([]int32, len(ports))
	for i, p := range ports {
		numbers[i] = p.Number
	}
	slices.Sort(numbers)
	ranks := make(map[int32]int, len(numbers))
	for i, n := range numbers {
		ranks[n] = i
	}
	return ranks
}

// ActivePortsAnnotations are the pod annotations that list the target ports a pod
// serves now (comma-separated; data-parallel ranks), the first present wins: llm-d's,
// then GIE's, which llm-d still reads (llm-d-router pkg/epp/datastore/datastore.go) and
// GIE's reference picker reads alone (gateway-api-inference-extension
// pkg/lwepp/datastore/datastore.go). Without one every target port is served; an
// entry that is not one of the pool's target ports is ignored, so an empty value
// serves none.
var ActivePortsAnnotations = []string{"llm-d.ai/active-ports", "inference.networking.k8s.io/active-ports"}

// activePorts returns the ports the pod's active-ports annotation lists and the
// annotation's key; nil when it has none (every target port is active).
func activePorts(pod *corev1.Pod) (map[int32]bool, string) {
	for _, key := range ActivePortsAnnotations {
		value, ok := pod.Annotations[key]
		if !ok {
			continue
		}
		ports := map[int32]bool{}
		for entry := range strings.SplitSeq(value, ",") {
			if n, err := strconv.ParseInt(strings.TrimSpace(entry), 10, 32); err == nil && n > 0 {
				ports[int32(n)] = true
			}
		}
		return ports, key
	}
	return nil, ""
}

// RoleLabel is the pod label that gives a pod's part in disaggregated prefill and
// decode (router.Worker.Role), as llm-d labels its pods: prefill, decode,
// prefill-decode or both (absent: both). A pod with another value is skipped.
const RoleLabel = "llm-d.ai/role"

// llm-d's role values beyond router's: prefill-decode replaced both (now deprecated in
// llm-d-inference-scheduler's pkg/plugins/filter/pd_role.go); the encode-* roles of its
// E/P/D disaggregation also prefill (encode-prefill) or serve whole requests
// (encode-prefill-decode). An encode-only pod serves no text request.
const (
	rolePrefillDecode       = "prefill-decode"
	roleEncodePrefill       = "encode-prefill"
	roleEncodePrefillDecode = "encode-prefill-decode"
)

// roleOf maps a pod's RoleLabel value to router.Worker.Role; ok is false for a value
// kvroute cannot route to.
func roleOf(label string) (role string, ok bool) {
	switch label {
	case "", router.RolePrefill, router.RoleDecode, router.RoleBoth:
		return label, true
	case rolePrefillDecode, roleEncodePrefillDecode:
		return router.RoleBoth, true
	case roleEncodePrefill:
		return router.RolePrefill, true
	}
	return "", false
}

// serving returns the pod's IP if it may take requests, or why not.
func serving(pod *corev1.Pod) (netip.Addr, string) {
	switch {
	case pod.DeletionTimestamp != nil:
		return netip.Addr{}, "terminating"
	case pod.Status.Phase != corev1.PodRunning:
		return netip.Addr{}, "phase " + string(pod.Status.Phase)
	}
	ready := false
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return netip.Addr{}, "not ready"
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, fmt.Sprintf("no usable pod IP (%q)", pod.Status.PodIP)
	}
	return ip.Unmap(), ""
}

// parseModels reads a comma-separated models annotation; empty entries are dropped.
func parseModels(value string) ([]string, error) {
	var models []string
	for m := range strings.SplitSeq(value, ",") {
		m = strings.TrimSpace(m)
		switch {
		case m == "":
			continue
		case len(m) > maxModelLength:
			return nil, fmt.Errorf("a model name is longer than %d bytes", maxModelLength)
		case len(models) == maxModels:
			return nil, fmt.Errorf("more than %d models", maxModels)
		}
		models = append(models, m)
	}
	if len(models) == 0 {
		return nil, fmt.Errorf("lists no model (%q)", value)
	}
	return models, nil
}
