package kube

import (
	"fmt"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/priority"
)

// poolGroup is the InferencePool's API group, which an objective's poolRef names (its
// CRD's default).
const poolGroup = "inference.networking.k8s.io"

// InferenceObjective is the part of GIE's InferenceObjective v1alpha2 that kvroute
// reads: which pool it belongs to, and its priority.
type InferenceObjective struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferenceObjectiveSpec `json:"spec"`
}

// InferenceObjectiveSpec is the objective's spec.
type InferenceObjectiveSpec struct {
	// Priority is how important the objective's requests are; below 0 is sheddable.
	// Unset reads as 0, as GIE's endpoint picker reads it.
	Priority *int `json:"priority,omitempty"`
	// PoolRef names the InferencePool, in the objective's namespace.
	PoolRef PoolObjectReference `json:"poolRef"`
}

// PoolObjectReference names an InferencePool in the referrer's namespace.
type PoolObjectReference struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name"`
}

// ObjectiveSink hears the objectives the cluster defines for the pool: name →
// priority, each complete set. *priority.Objectives satisfies it.
type ObjectiveSink interface {
	SetCluster(objectives map[string]int)
}

// objectives reads the pool's objectives from the cache: those whose poolRef names the
// pool (in the InferencePool's group) and that are not being deleted, at most
// priority.MaxObjectives of them, the first by name. GIE's endpoint picker keeps the
// same set (controller/inferenceobjective_reconciler.go).
func (s *Source) objectives(store cache.Store) (map[string]int, []string) {
	out := map[string]int{}
	found, problems := poolObjects(s, store, func(o *InferenceObjective) *PoolObjectReference { return &o.Spec.PoolRef })
	for _, o := range found {
		if err := priority.ValidName(o.Name); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		p := 0
		if o.Spec.Priority != nil {
			p = *o.Spec.Priority
		}
		out[o.Name] = p
	}
	if len(out) > priority.MaxObjectives {
		names := slices.Sorted(maps.Keys(out))
		for _, name := range names[priority.MaxObjectives:] {
			delete(out, name)
		}
		problems = append(problems, fmt.Sprintf("%d objectives name the pool: the first %d by name are kept", len(names), priority.MaxObjectives))
	}
	slices.Sort(problems)
	return out, problems
}

// clearObjectives drops the cluster's objectives: their CRD is gone.
func (s *Source) clearObjectives() {
	s.lastObjectives, s.lastObjectiveProblems = nil, nil
	s.objectiveSink.SetCluster(nil)
}

// publishObjectives hands the pool's objectives to the sink, logging a change of set.
func (s *Source) publishObjectives(store cache.Store) {
	objectives, problems := s.objectives(store)
	if !slices.Equal(problems, s.lastObjectiveProblems) {
		if len(problems) > 0 {
			s.log.Warn("kubernetes discovery: InferenceObjectives left out", "problems", problems)
		}
		s.lastObjectiveProblems = problems
	}
	if s.lastObjectives != nil && maps.Equal(objectives, s.lastObjectives) {
		return
	}
	sheddable := 0
	for _, p := range objectives {
		if priority.Sheddable(p) {
			sheddable++
		}
	}
	s.log.Info("kubernetes discovery: the pool's InferenceObjectives",
		"pool", s.cfg.Pool, "namespace", s.namespace, "objectives", len(objectives), "sheddable", sheddable)
	s.objectiveSink.SetCluster(objectives)
	s.lastObjectives = objectives // once the sink has them: a set it missed is published again
}

// poolObjects reads the namespace's objects of one kind from the cache that name the
// pool in their poolRef (in the InferencePool's group) and are not being deleted; one
// that does not convert is a problem, named.
func poolObjects[T any](s *Source, store cache.Store, poolRef func(*T) *PoolObjectReference) ([]T, []string) {
	var found []T
	var problems []string
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetNamespace() != s.namespace || u.GetDeletionTimestamp() != nil {
			continue
		}
		var o T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &o); err != nil {
			problems = append(problems, fmt.Sprintf("%s: left out: %v", u.GetName(), err))
			continue
		}
		if ref := poolRef(&o); ref == nil || ref.Name != s.cfg.Pool || (ref.Group != "" && ref.Group != poolGroup) {
			continue
		}
		found = append(found, o)
	}
	return found, problems
}

// trimToSpec keeps what kvroute reads of an InferenceObjective or an
// InferenceModelRewrite, so the informer's cache holds its name, creation time (the
// rewrites' order) and spec, not its status or managed fields.
func trimToSpec(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	trimmed := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind()}}
	trimmed.SetName(u.GetName())
	trimmed.SetNamespace(u.GetNamespace())
	trimmed.SetUID(u.GetUID())
	trimmed.SetResourceVersion(u.GetResourceVersion())
	trimmed.SetCreationTimestamp(u.GetCreationTimestamp())
	trimmed.SetDeletionTimestamp(u.GetDeletionTimestamp())
	if spec, ok := u.Object["spec"]; ok {
		trimmed.Object["spec"] = spec
	}
	return trimmed, nil
}
