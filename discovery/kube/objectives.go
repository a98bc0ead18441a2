package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

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

// DefaultCRDCheck is how often kvroute reads the API server's discovery to learn
// whether it serves InferenceObjectives: one small GET a minute per replica, and an
// objective CRD installed or removed is followed within a minute.
const DefaultCRDCheck = time.Minute

// crdCheckTimeout bounds one discovery read: a hung API server delays the next check,
// never the workers.
const crdCheckTimeout = 30 * time.Second

// crdFound is what one discovery read found of InferenceObjectives.
type crdFound int

const (
	crdUnknown   crdFound = iota // discovery failed: nothing learnt
	crdServed                    // the API server serves them (their CRD is installed)
	crdNotServed                 // it does not (not installed, or removed)
)

// crdCheck is one discovery read's finding, with the error of a failed one.
type crdCheck struct {
	found crdFound
	err   error
}

// checkObjectivesServed reads whether the API server serves InferenceObjectives, as
// GIE's endpoint picker does at start (pkg/epp/server/controller_config.go, gvkExists:
// the group version's resource list).
func (s *Source) checkObjectivesServed(ctx context.Context) crdCheck {
	ctx, cancel := context.WithTimeout(ctx, crdCheckTimeout)
	defer cancel()
	list, err := s.clients.Core.Discovery().ServerResourcesForGroupVersionWithContext(ctx, ObjectiveResource().GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return crdCheck{found: crdNotServed}
	case err != nil:
		return crdCheck{found: crdUnknown, err: err}
	case slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == ObjectiveResource().Resource }):
		return crdCheck{found: crdServed}
	}
	return crdCheck{found: crdNotServed}
}

// objectiveWatch follows the pool's InferenceObjectives while the API server serves
// them. A goroutine reads discovery every Deps.CRDCheck (one read in flight at most);
// Run's loop hears each finding (follow) and starts the informer when the CRD is there,
// or stops it and drops the cluster's objectives when the CRD is gone. An informer on
// a resource that is not served would retry and warn forever, as GIE's picker avoids
// by watching only what its discovery found at start. A nil *objectiveWatch (no
// Deps.Objectives) watches nothing. Apart from its checker goroutine, it is used by
// Run's goroutine alone.
type objectiveWatch struct {
	s       *Source
	every   time.Duration
	checks  chan crdCheck // the checker's findings
	dirty   chan struct{} // a change the informer saw
	checked chan struct{} // closed when the checker has returned
	last    crdFound      // the last finding followed; crdUnknown before the first
	decided bool          // a finding (or a first read that failed) has decided whether to watch

	// While watching: the informer, its factory, and what ends them.
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
}

// newObjectiveWatch returns the source's watch of objectives, or nil when none is wanted.
func (s *Source) newObjectiveWatch() *objectiveWatch {
	if s.objectiveSink == nil {
		return nil
	}
	return &objectiveWatch{s: s, every: s.crdCheck, checks: make(chan crdCheck), dirty: make(chan struct{}, 1), checked: make(chan struct{})}
}

// start runs the checker until ctx is done: a read at once, then one each interval.
func (w *objectiveWatch) start(ctx context.Context) {
	if w == nil {
		return
	}
	go func() {
		defer close(w.checked)
		ticker := time.NewTicker(w.every)
		defer ticker.Stop()
		for {
			select {
			case w.checks <- w.s.checkObjectivesServed(ctx):
			case <-ctx.Done():
				return
			}
			select {
			case <-ticker.C:
			case <-ctx.Done():
				return
			}
		}
	}()
}

// findings and changes are the channels Run's loop selects on; nil (never ready)
// without a watch.
func (w *objectiveWatch) findings() <-chan crdCheck {
	if w == nil {
		return nil
	}
	return w.checks
}

func (w *objectiveWatch) changes() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.dirty
}

// follow acts on a finding: served, watch; not served, stop watching and drop the
// cluster's objectives. A failed read changes nothing, except before any finding: then
// kvroute watches, and the informer's retries say why if that was wrong.
func (w *objectiveWatch) follow(ctx context.Context, c crdCheck) error {
	s := w.s
	gv := ObjectiveResource().GroupVersion().String()
	switch c.found {
	case crdUnknown:
		if w.last != crdUnknown || !w.decided {
			s.log.Warn("kubernetes discovery: cannot tell whether InferenceObjectives are served; checked again later",
				"group_version", gv, "watching", w.informer != nil || !w.decided, "error", c.err)
		}
		w.last = crdUnknown
		if w.decided {
			return nil
		}
		w.decided = true
		return w.watch(ctx)
	case crdServed:
		if w.informer == nil {
			s.log.Info("kubernetes discovery: InferenceObjectives are served: watching the pool's", "group_version", gv)
		}
		w.last, w.decided = crdServed, true
		return w.watch(ctx)
	}
	if w.last != crdNotServed {
		s.log.Info("kubernetes discovery: InferenceObjectives are not served (their CRD is not installed): objectives come from priority.objectives alone, until the CRD is installed",
			"group_version", gv, "checked_every", w.every)
	}
	w.last, w.decided = crdNotServed, true
	if w.informer != nil {
		w.stopInformer()
		s.lastObjectives, s.lastObjectiveProblems = nil, nil
		s.objectiveSink.SetCluster(nil)
	}
	return nil
}

// watch starts the informer of the namespace's InferenceObjectives, each change poking
// dirty, unless it runs already.
func (w *objectiveWatch) watch(ctx context.Context) error {
	if w.informer != nil {
		return nil
	}
	// Objectives name their pool in the spec, which no field selector reaches: the
	// namespace's are read, and trimmed to what objectives reads.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.s.clients.Dynamic, w.s.resync, w.s.namespace, nil)
	informer := factory.ForResource(ObjectiveResource()).Informer()
	if err := informer.SetTransform(trimObjective); err != nil {
		return fmt.Errorf("discovery: watch inferenceobjectives: %w", err)
	}
	if err := w.s.watch("inferenceobjectives", informer, w.dirty); err != nil {
		return err
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.factory, w.informer = factory, informer
	factory.Start(ctx.Done())
	return nil
}

// publish hands the informer's objectives to the sink; a poke from an informer stopped
// since is ignored.
func (w *objectiveWatch) publish() {
	if w.informer != nil {
		w.s.publishObjectives(w.informer.GetStore())
	}
}

// stopInformer ends the informer and waits for it.
func (w *objectiveWatch) stopInformer() {
	w.cancel()
	w.factory.Shutdown()
	w.factory, w.informer, w.cancel = nil, nil, nil
}

// stop ends the watch once Run's ctx is done: it waits for the checker and the informer.
func (w *objectiveWatch) stop() {
	if w == nil {
		return
	}
	<-w.checked
	if w.informer != nil {
		w.stopInformer()
	}
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
