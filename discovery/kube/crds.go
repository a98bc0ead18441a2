package kube

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// The API groups InferenceObjectives and InferenceModelRewrites are served in.
// llm-d-router's endpoint picker (GIE's successor) serves them in Group; GIE's picker
// (v1.0 to v1.5) read them in LegacyGroup, which llm-d-router still reads where its
// CRDs are the only ones installed (pkg/epp/server/controller_config.go).
const (
	Group       = "llm-d.ai"
	LegacyGroup = "inference.networking.x-k8s.io"
	Version     = "v1alpha2"
	// The kinds' resources, the same in both groups.
	ObjectivesResource    = "inferenceobjectives"
	ModelRewritesResource = "inferencemodelrewrites"
)

// GroupVersions are the group versions a kind is read in, the preferred first: per
// kind, kvroute reads the first one the API server's discovery serves it in, as
// llm-d-router's picker does.
func GroupVersions() []schema.GroupVersion {
	return []schema.GroupVersion{{Group: Group, Version: Version}, {Group: LegacyGroup, Version: Version}}
}

// ObjectiveResource is the InferenceObjective resource in gv (one of GroupVersions).
func ObjectiveResource(gv schema.GroupVersion) schema.GroupVersionResource {
	return gv.WithResource(ObjectivesResource)
}

// ModelRewriteResource is the InferenceModelRewrite resource in gv (one of
// GroupVersions).
func ModelRewriteResource(gv schema.GroupVersion) schema.GroupVersionResource {
	return gv.WithResource(ModelRewritesResource)
}

// DefaultCRDCheck is how often kvroute reads the API server's discovery to learn where
// it serves InferenceObjectives and InferenceModelRewrites: one small GET per group a
// minute per replica, and a CRD installed, removed or moved to the other group is
// followed within a minute.
const DefaultCRDCheck = time.Minute

// crdCheckTimeout bounds one discovery read: a hung API server delays the next check,
// never the workers.
const crdCheckTimeout = 30 * time.Second

// crdFound is what discovery reads found of a kind in a group version.
type crdFound int

const (
	crdUnknown   crdFound = iota // never read: no read of the group version has succeeded
	crdServed                    // the API server serves the kind there (its CRD is installed)
	crdNotServed                 // it does not (not installed, or removed)
)

// gvRead is one discovery read of a group version: the resources it serves (none: not
// served, as a 404 says), or the error of a read that failed.
type gvRead struct {
	resources []string
	err       error
}

// crdReads is one discovery check: a read of each of GroupVersions.
type crdReads map[schema.GroupVersion]gvRead

// checkGroupVersions is readGroupVersions guarded: a read that panics (a bug the API
// server's answer reached) is recovered, logged and counted
// (kvroute_background_panics_total{loop="discovery"}), and failed for every group
// version, which changes nothing.
func (s *Source) checkGroupVersions(ctx context.Context) crdReads {
	var reads crdReads
	if err := s.guard.Do(func() error { reads = s.readGroupVersions(ctx); return nil }); err != nil {
		reads = crdReads{}
		for _, gv := range GroupVersions() {
			reads[gv] = gvRead{err: err}
		}
	}
	return reads
}

// readGroupVersions reads which resources the API server serves in each group version,
// as llm-d-router's picker does at start (controller_config.go, gvkExists: the group
// version's resource list).
func (s *Source) readGroupVersions(ctx context.Context) crdReads {
	ctx, cancel := context.WithTimeout(ctx, crdCheckTimeout)
	defer cancel()
	out := crdReads{}
	for _, gv := range GroupVersions() {
		list, err := s.clients.Core.Discovery().ServerResourcesForGroupVersionWithContext(ctx, gv.String())
		switch {
		case apierrors.IsNotFound(err):
			out[gv] = gvRead{}
		case err != nil:
			out[gv] = gvRead{err: err}
		default:
			var names []string
			for _, r := range list.APIResources {
				names = append(names, r.Name)
			}
			out[gv] = gvRead{resources: names}
		}
	}
	return out
}

// crdWatch follows the pool's InferenceObjectives and InferenceModelRewrites, each kind
// in the group the API server serves it in (kindWatch). A goroutine reads discovery
// every Deps.CRDCheck (one check in flight at most); Run's loop hears each check
// (follow) and each kind starts, moves or stops its informer. An informer on a
// resource that is not served would retry and warn forever, as llm-d-router's picker
// avoids by watching only what its discovery found at start. A nil *crdWatch (neither
// Deps.Objectives nor Deps.Rewrites) watches nothing. Apart from its checker goroutine,
// it is used by Run's goroutine alone.
type crdWatch struct {
	s       *Source
	every   time.Duration
	checks  chan crdReads
	checked chan struct{} // closed when the checker has returned
	// failing: the group versions whose last read failed, so a failure is logged once.
	failing map[schema.GroupVersion]bool
	// The kinds followed; nil: not wanted.
	objectives, rewrites *kindWatch
}

// newCRDWatch returns the source's watch of its kinds, or nil when none is wanted.
func (s *Source) newCRDWatch() *crdWatch {
	w := &crdWatch{s: s, every: s.crdCheck, checks: make(chan crdReads), checked: make(chan struct{}), failing: map[schema.GroupVersion]bool{}}
	if s.objectiveSink != nil {
		w.objectives = &kindWatch{s: s, kind: "InferenceObjectives", resource: ObjectivesResource,
			alone: "objectives come from priority.objectives alone", transform: trimToSpec,
			publish: s.publishObjectives, clear: s.clearObjectives}
	}
	if s.rewriteSink != nil {
		w.rewrites = &kindWatch{s: s, kind: "InferenceModelRewrites", resource: ModelRewritesResource,
			alone: "model rewrites come from model_rewrites alone", transform: trimToSpec,
			publish: s.publishRewrites, clear: s.clearRewrites}
	}
	if w.objectives == nil && w.rewrites == nil {
		return nil
	}
	for _, k := range w.kinds() {
		k.dirty, k.known = make(chan struct{}, 1), map[schema.GroupVersion]crdFound{}
	}
	return w
}

func (w *crdWatch) kinds() []*kindWatch {
	var out []*kindWatch
	for _, k := range []*kindWatch{w.objectives, w.rewrites} {
		if k != nil {
			out = append(out, k)
		}
	}
	return out
}

// start runs the checker until ctx is done: a check at once, then one each interval.
func (w *crdWatch) start(ctx context.Context) {
	if w == nil {
		return
	}
	go func() {
		defer close(w.checked)
		ticker := time.NewTicker(w.every)
		defer ticker.Stop()
		for {
			select {
			case w.checks <- w.s.checkGroupVersions(ctx):
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

// findings is the channel Run's loop selects on; nil (never ready) without a watch.
func (w *crdWatch) findings() <-chan crdReads {
	if w == nil {
		return nil
	}
	return w.checks
}

// kind returns one of the kinds followed (nil: not followed) for Run's loop.
func (w *crdWatch) kind(objectives bool) *kindWatch {
	switch {
	case w == nil:
		return nil
	case objectives:
		return w.objectives
	}
	return w.rewrites
}

// follow acts on a check: each kind moves to where it is served now. A read that
// failed changes nothing for its group version (logged once until one succeeds).
func (w *crdWatch) follow(ctx context.Context, reads crdReads) error {
	for _, gv := range GroupVersions() {
		r := reads[gv]
		if r.err != nil && !w.failing[gv] {
			w.s.log.Warn("kubernetes discovery: cannot tell which GIE kinds the API server serves in a group; checked again later (what is watched stays)",
				"group_version", gv.String(), "error", r.err)
		}
		w.failing[gv] = r.err != nil
	}
	for _, k := range w.kinds() {
		if err := k.follow(ctx, reads); err != nil {
			return err
		}
	}
	return nil
}

// stop ends the watch once Run's ctx is done: it waits for the checker and the informers.
func (w *crdWatch) stop() {
	if w == nil {
		return
	}
	<-w.checked
	for _, k := range w.kinds() {
		if k.informer != nil {
			k.stopInformer()
		}
	}
}

// kindWatch follows one kind in the group version discovery serves it in: the first of
// GroupVersions that serves it, else (no read of it succeeded yet) the first not known
// to be without it, else none. On none it stops its informer and clears the cluster's
// set; on a move to the other group it starts an informer there, and the set it lists
// replaces the old one once listed whole.
type kindWatch struct {
	s         *Source
	kind      string // "InferenceObjectives", for the logs
	resource  string
	alone     string // what stands while the kind is not served, for the log
	transform cache.TransformFunc
	publish   func(cache.Store)
	clear     func()
	dirty     chan struct{} // a change the informer saw, or its first list done

	known   map[schema.GroupVersion]crdFound // each group version's last successful read
	decided bool                             // a check has been followed
	both    bool                             // served in both groups, as last logged

	// While watching: the group version, the informer, its factory, what ends them, and
	// the end of the goroutine that pokes dirty once the first list is done.
	gv       schema.GroupVersion
	factory  dynamicinformer.DynamicSharedInformerFactory
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	synced   chan struct{}
}

// changes is the channel Run's loop selects on; nil (never ready) without the kind.
func (k *kindWatch) changes() <-chan struct{} {
	if k == nil {
		return nil
	}
	return k.dirty
}

// target is the group version the kind should be watched in now; false: none.
func (k *kindWatch) target() (schema.GroupVersion, bool) {
	gvs := GroupVersions()
	for _, gv := range gvs {
		if k.known[gv] == crdServed {
			return gv, true
		}
	}
	// Served nowhere that discovery answered for: where it was never read, it may be
	// (the informer's retries say why, if not), as before any check succeeds.
	for _, gv := range gvs {
		if k.known[gv] == crdUnknown {
			return gv, true
		}
	}
	return schema.GroupVersion{}, false
}

// follow acts on a check: watch the kind where it is served now, or stop.
func (k *kindWatch) follow(ctx context.Context, reads crdReads) error {
	for gv, r := range reads {
		switch {
		case r.err != nil: // keeps what was known
		case slices.Contains(r.resources, k.resource):
			k.known[gv] = crdServed
		default:
			k.known[gv] = crdNotServed
		}
	}
	gvs := GroupVersions()
	if both := k.known[gvs[0]] == crdServed && k.known[gvs[1]] == crdServed; both != k.both {
		k.both = both
		if both {
			k.s.log.Warn(fmt.Sprintf("kubernetes discovery: %s are served in both groups: those of the first are read, the others ignored (as llm-d-router's picker does)", k.kind),
				"read", gvs[0].String(), "ignored", gvs[1].String())
		}
	}
	gv, watch := k.target()
	wasDecided := k.decided
	k.decided = true
	switch {
	case !watch:
		if k.informer != nil || !wasDecided {
			k.s.log.Info(fmt.Sprintf("kubernetes discovery: %s are not served (their CRD is not installed in either group): %s, until it is", k.kind, k.alone),
				"group_versions", []string{gvs[0].String(), gvs[1].String()}, "checked_every", k.s.crdCheck)
		}
		if k.informer != nil {
			k.stopInformer()
			k.clear()
		}
		return nil
	case k.informer != nil && gv == k.gv:
		return nil
	case k.informer != nil:
		k.s.log.Info(fmt.Sprintf("kubernetes discovery: %s are served in another group now: watching the pool's there", k.kind),
			"group_version", gv.String(), "was", k.gv.String())
		k.stopInformer() // its set stands until the new informer has listed
	default:
		k.s.log.Info(fmt.Sprintf("kubernetes discovery: %s are served: watching the pool's", k.kind),
			"group_version", gv.String(), "confirmed", k.known[gv] == crdServed)
	}
	return k.watch(ctx, gv)
}

// watch starts the informer of the namespace's objects of the kind in gv, each change
// poking dirty, and a poke once its first list is done.
func (k *kindWatch) watch(ctx context.Context, gv schema.GroupVersion) error {
	// The objects name their pool in the spec, which no field selector reaches: the
	// namespace's are read, and trimmed to what kvroute reads.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(k.s.clients.Dynamic, k.s.resync, k.s.namespace, nil)
	informer := factory.ForResource(gv.WithResource(k.resource)).Informer()
	if err := informer.SetTransform(k.transform); err != nil {
		return fmt.Errorf("discovery: watch %s: %w", k.resource, err)
	}
	if err := k.s.watch(gv.WithResource(k.resource).GroupResource().String(), informer, k.dirty); err != nil {
		return err
	}
	ctx, k.cancel = context.WithCancel(ctx)
	k.gv, k.factory, k.informer, k.synced = gv, factory, informer, make(chan struct{})
	factory.Start(ctx.Done())
	// An empty list adds nothing, so no event would publish it: a kind moved to a group
	// holding none of the pool's objects would keep the old group's set.
	go func(synced chan struct{}, dirty chan<- struct{}) {
		defer close(synced)
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			select {
			case dirty <- struct{}{}:
			default:
			}
		}
	}(k.synced, k.dirty)
	return nil
}

// changed publishes the informer's set once it has listed whole; a poke from an
// informer stopped since, or one still listing, is ignored. A publish that panics (a
// bug the cluster's objects reached) is recovered, logged and counted
// (kvroute_background_panics_total{loop="discovery"}): the set in force stays, and
// the next change publishes again.
func (k *kindWatch) changed() {
	if k.informer != nil && k.informer.HasSynced() {
		_ = k.s.guard.Do(func() error { k.publish(k.informer.GetStore()); return nil })
	}
}

// stopInformer ends the informer and waits for it.
func (k *kindWatch) stopInformer() {
	k.cancel()
	k.factory.Shutdown()
	<-k.synced
	k.gv, k.factory, k.informer, k.cancel, k.synced = schema.GroupVersion{}, nil, nil, nil, nil
}
