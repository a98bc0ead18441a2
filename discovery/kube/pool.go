package kube

import (
	"errors"
	"fmt"
	"regexp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PoolResource is the InferencePool v1 resource the pool is read from.
func PoolResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
}

// InferencePool is the part of GIE's InferencePool v1 that kvroute reads or that its
// manifests set. Status is left out: kvroute never writes it, and decoding from the
// API server ignores fields this type lacks.
type InferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferencePoolSpec `json:"spec"`
}

// InferencePoolSpec is the pool's spec.
type InferencePoolSpec struct {
	// Selector picks the pool's pods by their labels.
	Selector LabelSelector `json:"selector"`
	// TargetPorts are the ports traffic goes to on each pod (1 to 8, unique).
	TargetPorts []Port `json:"targetPorts"`
	// AppProtocol is http (default) or kubernetes.io/h2c, the model servers' protocol:
	// kvroute's own requests to them (probes, scrapes, model lists) speak it too.
	AppProtocol string `json:"appProtocol,omitempty"`
	// EndpointPickerRef names the endpoint picker's Service: kvroute's.
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// LabelSelector is the pool's selector: equality on labels only.
type LabelSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// Port is a port number.
type Port struct {
	Number int32 `json:"number"`
}

// EndpointPickerRef names the pool's endpoint picker.
type EndpointPickerRef struct {
	Group       *string `json:"group,omitempty"`
	Kind        string  `json:"kind,omitempty"`
	Name        string  `json:"name"`
	Port        *Port   `json:"port,omitempty"`
	FailureMode string  `json:"failureMode,omitempty"`
}

var (
	labelName  = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
)

// Validate checks what the InferencePool CRD's schema checks of these fields, plus a
// non-empty selector: an empty one would make every pod of the namespace a worker.
// Errors name the field.
func (s InferencePoolSpec) Validate() error {
	if len(s.Selector.MatchLabels) == 0 {
		return errors.New("spec.selector.matchLabels: empty (it would select every pod in the namespace)")
	}
	for k, v := range s.Selector.MatchLabels {
		if len(k) > 317 || !labelName.MatchString(k) {
			return fmt.Errorf("spec.selector.matchLabels: %q is not a label name", k)
		}
		if len(v) > 63 || !labelValue.MatchString(v) {
			return fmt.Errorf("spec.selector.matchLabels[%s]: %q is not a label value", k, v)
		}
	}
	if n := len(s.TargetPorts); n < 1 || n > 8 {
		return fmt.Errorf("spec.targetPorts: must list 1 to 8 ports, got %d", n)
	}
	seen := map[int32]bool{}
	for i, p := range s.TargetPorts {
		if p.Number < 1 || p.Number > 65535 {
			return fmt.Errorf("spec.targetPorts[%d].number: must be 1 to 65535, got %d", i, p.Number)
		}
		if seen[p.Number] {
			return fmt.Errorf("spec.targetPorts[%d].number: port %d listed twice", i, p.Number)
		}
		seen[p.Number] = true
	}
	switch s.AppProtocol {
	case "", "http", appProtocolH2C:
	default:
		return fmt.Errorf("spec.appProtocol: must be http or %s, got %q", appProtocolH2C, s.AppProtocol)
	}
	if r := s.EndpointPickerRef; r != nil {
		if r.Name == "" {
			return errors.New("spec.endpointPickerRef.name: required")
		}
		if (r.Kind == "" || r.Kind == "Service") && r.Port == nil {
			return errors.New("spec.endpointPickerRef.port: required when kind is Service (the default)")
		}
		if r.Port != nil && (r.Port.Number < 1 || r.Port.Number > 65535) {
			return fmt.Errorf("spec.endpointPickerRef.port.number: must be 1 to 65535, got %d", r.Port.Number)
		}
		switch r.FailureMode {
		case "", "FailOpen", "FailClose":
		default:
			return fmt.Errorf("spec.endpointPickerRef.failureMode: must be FailOpen or FailClose, got %q", r.FailureMode)
		}
	}
	return nil
}
