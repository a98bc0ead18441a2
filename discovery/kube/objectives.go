package kube

import (
	"fmt"
	"maps"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/priority"
)

// ObjectiveResource is the InferenceObjective resource (GIE's apix v1alpha2) whose
// objects give the pool's objectives their priorities.
func ObjectiveResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferenceobjectives"}
}

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

// objectivesServed reports whether the API server serves InferenceObjectives. Like
// GIE's endpoint picker, kvroute watches them only when their CRD is installed (at
// start): an informer on a resource that does not exist retries and warns forever.
// A discovery that fails otherwise is taken as served: the informer's retries say why.
func (s *Source) objectivesServed() bool {
	gv := ObjectiveResource().GroupVersion().String()
	list, err := s.clients.Core.Discovery().ServerResourcesForGroupVersion(gv)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		s.log.Warn("kubernetes discovery: cannot tell whether InferenceObjectives are served; watching them", "group_version", gv, "error", err)
		return true
	case slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == ObjectiveResource().Resource }):
		return true
	}
	s.log.Info("kubernetes discovery: InferenceObjectives are not served (their CRD is not installed): objectives come from priority.objectives alone; restart kvroute once it is",
		"group_version", gv)
	return false
}

// watchObjectives makes the informer of the namespace's InferenceObjectives, each
// change poking dirty, when objectives are wanted and served; else it returns nils.
// The caller starts the factory and shuts it down.
func (s *Source) watchObjectives(dirty chan<- struct{}) (dynamicinformer.DynamicSharedInformerFactory, cache.SharedIndexInformer, error) {
	if s.objectiveSink == nil || !s.objectivesServed() {
		return nil, nil, nil
	}
	// Objectives name their pool in the spec, which no field selector reaches: the
	// namespace's are read, and trimmed to what objectives reads.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.clients.Dynamic, s.resync, s.namespace, nil)
	informer := factory.ForResource(ObjectiveResource()).Informer()
	if err := informer.SetTransform(trimObjective); err != nil {
		return nil, nil, fmt.Errorf("discovery: watch inferenceobjectives: %w", err)
	}
	if err := s.watch("inferenceobjectives", informer, dirty); err != nil {
		return nil, nil, err
	}
	return factory, informer, nil
}

// objectives reads the pool's objectives from the cache: those whose poolRef names the
// pool (in the InferencePool's group) and that are not being deleted, at most
// priority.MaxObjectives of them, the first by name. GIE's endpoint picker keeps the
// same set (controller/inferenceobjective_reconciler.go).
func (s *Source) objectives(store cache.Store) (map[string]int, []string) {
	out := map[string]int{}
	var problems []string
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetNamespace() != s.namespace || u.GetDeletionTimestamp() != nil {
			continue
		}
		var o InferenceObjective
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &o); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", u.GetName(), err))
			continue
		}
		if group := o.Spec.PoolRef.Group; o.Spec.PoolRef.Name != s.cfg.Pool || (group != "" && group != poolGroup) {
			continue
		}
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
	s.lastObjectives = objectives
	s.objectiveSink.SetCluster(objectives)
}

// trimObjective keeps what objectives reads of an InferenceObjective, so the
// informer's cache holds its name and spec, not its status or managed fields.
func trimObjective(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	trimmed := &unstructured.Unstructured{Object: map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind()}}
	trimmed.SetName(u.GetName())
	trimmed.SetNamespace(u.GetNamespace())
	trimmed.SetUID(u.GetUID())
	trimmed.SetResourceVersion(u.GetResourceVersion())
	trimmed.SetDeletionTimestamp(u.GetDeletionTimestamp())
	if spec, ok := u.Object["spec"]; ok {
		trimmed.Object["spec"] = spec
	}
	return trimmed, nil
}
