package kube

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/rewrite"
)

// InferenceModelRewrite is the part of GIE's InferenceModelRewrite v1alpha2 that
// kvroute reads: its pool and rules.
type InferenceModelRewrite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferenceModelRewriteSpec `json:"spec"`
}

// InferenceModelRewriteSpec is the rewrite's spec.
type InferenceModelRewriteSpec struct {
	PoolRef *PoolObjectReference `json:"poolRef"`
	Rules   []ModelRewriteRule   `json:"rules"`
}

// ModelRewriteRule is one rule: matches (OR; none: every model) and weighted targets.
type ModelRewriteRule struct {
	Matches []struct {
		Model *struct {
			Type  string `json:"type,omitempty"`
			Value string `json:"value"`
		} `json:"model,omitempty"`
	} `json:"matches,omitempty"`
	Targets []struct {
		Weight       int32  `json:"weight"`
		ModelRewrite string `json:"modelRewrite"`
	} `json:"targets,omitempty"`
}

// RewriteSink hears the model rewrites the cluster defines for the pool, oldest first,
// each set whole. *rewrite.Table satisfies it.
type RewriteSink interface {
	SetCluster(rewrites []rewrite.Rewrite)
}

// rewrites reads the pool's model rewrites from the cache: those whose poolRef names
// the pool (in the InferencePool's group) and that are not being deleted, oldest first
// (by creation time, then name), as GIE's endpoint picker orders them. One that kvroute
// cannot use (no targets, a bad name) is left out whole, with a problem naming why; so
// are those past rewrite.MaxRewrites. One with weights on some targets of a rule only
// is kept, its targets without a weight never drawn (as llm-d-router's picker draws),
// with a problem saying so.
func (s *Source) rewrites(store cache.Store) ([]rewrite.Rewrite, []string) {
	type dated struct {
		created metav1.Time
		rw      rewrite.Rewrite
	}
	var found []dated
	objects, problems := poolObjects(s, store, func(o *InferenceModelRewrite) *PoolObjectReference { return o.Spec.PoolRef })
	for _, o := range objects {
		rw, mixed, err := fromCRD(o)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: left out: %v", o.Name, err))
			continue
		}
		for _, m := range mixed {
			problems = append(problems, fmt.Sprintf("%s: kept, but spec%v: the targets without one are never drawn", o.Name, m))
		}
		found = append(found, dated{created: o.CreationTimestamp, rw: rw})
	}
	slices.SortFunc(found, func(a, b dated) int {
		if c := a.created.Compare(b.created.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.rw.Name, b.rw.Name)
	})
	if len(found) > rewrite.MaxRewrites {
		problems = append(problems, fmt.Sprintf("%d InferenceModelRewrites name the pool: the oldest %d are kept, the others left out", len(found), rewrite.MaxRewrites))
		found = found[:rewrite.MaxRewrites]
	}
	out := make([]rewrite.Rewrite, len(found))
	for i, d := range found {
		out[i] = d.rw
	}
	slices.Sort(problems)
	return out, problems
}

// fromCRD turns an InferenceModelRewrite into a rewrite, checked (rewrite.Rewrite.Check:
// mixed lists its rules with weights on some targets only).
func fromCRD(o InferenceModelRewrite) (_ rewrite.Rewrite, mixed []error, err error) {
	rw := rewrite.Rewrite{Name: o.Name, Rules: make([]rewrite.Rule, len(o.Spec.Rules))}
	for i, r := range o.Spec.Rules {
		for j, m := range r.Matches {
			if m.Model == nil {
				return rewrite.Rewrite{}, nil, fmt.Errorf("spec.rules[%d].matches[%d]: no model", i, j)
			}
			if m.Model.Type != "" && m.Model.Type != "Exact" {
				return rewrite.Rewrite{}, nil, fmt.Errorf("spec.rules[%d].matches[%d].model.type: only Exact is supported, got %q", i, j, m.Model.Type)
			}
			rw.Rules[i].Models = append(rw.Rules[i].Models, m.Model.Value)
		}
		for _, t := range r.Targets {
			rw.Rules[i].Targets = append(rw.Rules[i].Targets, rewrite.Target{Model: t.ModelRewrite, Weight: t.Weight})
		}
	}
	if mixed, err = rw.Check(); err != nil {
		return rewrite.Rewrite{}, nil, fmt.Errorf("spec%w", err)
	}
	return rw, mixed, nil
}

// publishRewrites hands the pool's model rewrites to the sink, logging a change of set.
func (s *Source) publishRewrites(store cache.Store) {
	rewrites, problems := s.rewrites(store)
	if !slices.Equal(problems, s.lastRewriteProblems) {
		if len(problems) > 0 {
			s.log.Warn("kubernetes discovery: InferenceModelRewrites left out or read in part", "problems", problems)
		}
		s.lastRewriteProblems = problems
	}
	if s.lastRewrites != nil && reflect.DeepEqual(rewrites, s.lastRewrites) {
		return
	}
	s.log.Info("kubernetes discovery: the pool's InferenceModelRewrites", "pool", s.cfg.Pool, "namespace", s.namespace, "rewrites", len(rewrites))
	if rewrites == nil {
		rewrites = []rewrite.Rewrite{}
	}
	s.rewriteSink.SetCluster(rewrites)
	s.lastRewrites = rewrites // once the sink has them: a set it missed is published again
}

// clearRewrites drops the cluster's model rewrites: their CRD is gone.
func (s *Source) clearRewrites() {
	s.lastRewrites, s.lastRewriteProblems = nil, nil
	s.rewriteSink.SetCluster(nil)
}
