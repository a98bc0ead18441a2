package priority

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Objectives maps objective names to priorities: the config's (SetConfigured, at start
// and at each reload) and the cluster's InferenceObjectives of the pool (SetCluster,
// from discovery), a cluster's entry taking precedence over the config's of the same
// name. Lookups read an immutable merged map, without a lock. The zero value defines
// no objective; use it by pointer.
type Objectives struct {
	mu         sync.Mutex // serialises updates
	configured map[string]int
	cluster    map[string]int
	merged     atomic.Pointer[map[string]int]
}

// NewObjectives returns a table holding the config's objectives.
func NewObjectives(configured map[string]int) *Objectives {
	o := &Objectives{}
	o.SetConfigured(configured)
	return o
}

// Priority returns the objective's priority, and whether any source defines it. An
// objective neither defines (or the empty name) has priority 0: GIE's endpoint picker
// serves such a request as it serves one naming no objective.
func (o *Objectives) Priority(name string) (priority int, found bool) {
	if name == "" {
		return 0, false
	}
	m := o.merged.Load()
	if m == nil {
		return 0, false
	}
	priority, found = (*m)[name]
	return priority, found
}

// SetConfigured replaces the config's objectives (validated by Config.Validate). The
// map is copied.
func (o *Objectives) SetConfigured(objectives map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.configured = maps.Clone(objectives)
	o.merge()
}

// SetCluster replaces the objectives the cluster defines for the pool (name →
// spec.priority, an unset priority read as 0). The map is copied.
func (o *Objectives) SetCluster(objectives map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cluster = maps.Clone(objectives)
	o.merge()
}

// merge publishes the union of both sources. Called under mu.
func (o *Objectives) merge() {
	m := make(map[string]int, len(o.configured)+len(o.cluster))
	maps.Copy(m, o.configured)
	maps.Copy(m, o.cluster)
	o.merged.Store(&m)
}
