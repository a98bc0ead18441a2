package rewrite

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// script is a Rand that returns its values in turn, each taken modulo n.
type script struct{ values []int64 }

func (s *script) next() int64 {
	v := s.values[0]
	s.values = s.values[1:]
	return v
}
func (s *script) IntN(n int) int          { return int(s.next() % int64(n)) }
func (s *script) Int64N(n int64) int64    { return s.next() % n }
func alias(name, from, to string) Rewrite { return split(name, []string{from}, Target{Model: to}) }
func split(name string, from []string, targets ...Target) Rewrite {
	return Rewrite{Name: name, Rules: []Rule{{Models: from, Targets: targets}}}
}

func TestValidateNamesTheFieldAndTheError(t *testing.T) {
	long := strings.Repeat("m", MaxModelBytes+1)
	tests := []struct {
		name    string
		cfg     Config
		want    error
		wantMsg string
	}{
		{"no name", Config{alias("", "a", "b")}, ErrName, "model_rewrites[0].name:"},
		{"name with a space", Config{alias("a b", "a", "b")}, ErrName, "model_rewrites[0].name:"},
		{"duplicate names", Config{alias("x", "a", "b"), alias("x", "c", "d")}, ErrDuplicate, "model_rewrites[1].name:"},
		{"no rules", Config{{Name: "x"}}, ErrNoRules, "model_rewrites[0].rules:"},
		{"no targets", Config{{Name: "x", Rules: []Rule{{Models: []string{"a"}}}}}, ErrNoTargets, "model_rewrites[0].rules[0].targets:"},
		{"empty match", Config{alias("x", "", "b")}, ErrModel, "model_rewrites[0].rules[0].models[0]:"},
		{"empty target", Config{alias("x", "a", "")}, ErrModel, "model_rewrites[0].rules[0].targets[0].model:"},
		{"target too long", Config{alias("x", "a", long)}, ErrModel, "model_rewrites[0].rules[0].targets[0].model:"},
		{"control character", Config{alias("x", "a\n", "b")}, ErrModel, "model_rewrites[0].rules[0].models[0]:"},
		{"negative weight", Config{split("x", nil, Target{Model: "b", Weight: -1})}, ErrWeight, "model_rewrites[0].rules[0].targets[0].weight:"},
		{"weight past the CRD's maximum", Config{split("x", nil, Target{Model: "b", Weight: MaxWeight + 1})}, ErrWeight, "targets[0].weight:"},
		{"mixed weights", Config{split("x", nil, Target{Model: "b", Weight: 1}, Target{Model: "c"})}, ErrMixedWeights, "model_rewrites[0].rules[0].targets:"},
		{"too many targets", Config{split("x", nil, make([]Target, MaxTargets+1)...)}, ErrTooMany, "model_rewrites[0].rules[0].targets:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
	valid := Config{
		alias("alias", "small", "small-v1"),
		split("canary", []string{"big", "huge"}, Target{Model: "big-v1", Weight: 90}, Target{Model: "big-v2", Weight: 10}),
		split("fallback", nil, Target{Model: "base"}, Target{Model: "base-2"}),
	}
	assert.NoError(t, valid.Validate())
	assert.NoError(t, Config(nil).Validate())
}

func TestChoosePrecedence(t *testing.T) {
	table := NewTable(Config{
		split("config-generic", nil, Target{Model: "from-config-generic"}),
		alias("config-exact", "a", "from-config-a"),
		alias("config-b", "b", "from-config-b"),
		alias("config-b-later", "b", "from-config-b-later"),
		{Name: "two-rules", Rules: []Rule{
			{Models: []string{"c"}, Targets: []Target{{Model: "first-rule"}}},
			{Models: []string{"c", "d"}, Targets: []Target{{Model: "second-rule"}}},
		}},
		alias("replaced", "e", "from-config-e"),
	}, &script{}, nil)
	tests := []struct {
		model, rewrite, target string
	}{
		{"a", "config-exact", "from-config-a"},
		{"b", "config-b", "from-config-b"}, // the first listed wins
		{"c", "two-rules", "first-rule"},   // one rewrite's rules in their order
		{"d", "two-rules", "second-rule"},
		{"e", "replaced", "from-config-e"},
		{"unknown", "config-generic", "from-config-generic"}, // generic: every other model
	}
	check := func(t *testing.T, tests []struct{ model, rewrite, target string }) {
		t.Helper()
		for _, tt := range tests {
			c, ok := table.Choose(tt.model)
			require.True(t, ok, tt.model)
			assert.Equal(t, Choice{Rewrite: tt.rewrite, Target: tt.target}, c, tt.model)
		}
	}
	check(t, tests)
	assert.Equal(t, 6, table.Len())

	// The cluster's rewrites: an exact one beats the config's generic one, the cluster's
	// come before the config's, the cluster's generic one before the config's, and one
	// named as the config's replaces it.
	table.SetCluster([]Rewrite{
		alias("cluster-b", "b", "from-cluster-b"),
		split("cluster-generic", nil, Target{Model: "from-cluster-generic"}),
		alias("replaced", "f", "from-cluster-f"),
	})
	check(t, []struct{ model, rewrite, target string }{
		{"a", "config-exact", "from-config-a"}, // exact in the config beats the cluster's generic
		{"b", "cluster-b", "from-cluster-b"},
		{"unknown", "cluster-generic", "from-cluster-generic"},
		{"e", "cluster-generic", "from-cluster-generic"}, // the config's "replaced" is gone
		{"f", "replaced", "from-cluster-f"},
	})
	assert.Equal(t, 8, table.Len())

	table.SetCluster(nil)
	table.SetConfigured(nil)
	_, ok := table.Choose("a")
	assert.False(t, ok, "no rewrite: nothing matches")
	var none *Table
	_, ok = none.Choose("a")
	assert.False(t, ok, "a nil table rewrites nothing")
}

func TestChooseDrawsByWeight(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	// Weights 90 and 10: draws in [0, 90) go to v1, [90, 100) to v2. Unweighted targets
	// take a uniform draw over their count.
	rng := &script{values: []int64{0, 89, 90, 99, 100 + 45, 0, 1, 2}}
	table := NewTable(Config{
		split("canary", []string{"m"}, Target{Model: "v1", Weight: 90}, Target{Model: "v2", Weight: 10}),
		split("even", []string{"n"}, Target{Model: "x"}, Target{Model: "y"}, Target{Model: "z"}),
		alias("alias", "o", "o-v1"),
	}, rng, NewMetrics(reg))
	var got []string
	for range 5 {
		c, ok := table.Choose("m")
		require.True(t, ok)
		got = append(got, c.Target)
	}
	assert.Equal(t, []string{"v1", "v1", "v2", "v2", "v1"}, got)
	got = nil
	for range 3 {
		c, _ := table.Choose("n")
		got = append(got, c.Target)
	}
	assert.Equal(t, []string{"x", "y", "z"}, got)
	c, _ := table.Choose("o")
	assert.Equal(t, "o-v1", c.Target, "an alias draws nothing")
	assert.Empty(t, rng.values, "every scripted draw was used, and no more")

	assert.InDelta(t, 3, testutil.ToFloat64(table.metrics.chosen.WithLabelValues("canary", "v1")), 0)
	assert.InDelta(t, 2, testutil.ToFloat64(table.metrics.chosen.WithLabelValues("canary", "v2")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(table.metrics.chosen.WithLabelValues("alias", "o-v1")), 0)
	problems, err := testutil.CollectAndLint(table.metrics.chosen)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// A seeded source makes a run's targets reproducible.
func TestSeededDrawsRepeat(t *testing.T) {
	cfg := Config{split("canary", nil, Target{Model: "v1", Weight: 3}, Target{Model: "v2", Weight: 1})}
	draws := func() []string {
		table := NewTable(cfg, rand.New(rand.NewPCG(7, 8)), nil)
		var out []string
		for range 64 {
			c, _ := table.Choose("anything")
			out = append(out, c.Target)
		}
		return out
	}
	first := draws()
	assert.Equal(t, first, draws())
	assert.Contains(t, first, "v1")
	assert.Contains(t, first, "v2")
}

// A rule whose weights are set on some targets only is refused in the config
// (Validate), and accepted by Check, as llm-d-router's picker accepts such an
// InferenceModelRewrite: each such rule is reported, and its targets without a weight
// are never drawn (requestcontrol/director.go, selectWeightedModel). A rule with every
// weight unset still draws uniformly.
func TestMixedWeightsNeverDrawTheUnweightedTargets(t *testing.T) {
	rw := Rewrite{Name: "canary", Rules: []Rule{
		{Models: []string{"m"}, Targets: []Target{{Model: "unset-1"}, {Model: "v1", Weight: 3}, {Model: "unset-2"}, {Model: "v2", Weight: 1}, {Model: "unset-3"}}},
		{Models: []string{"n"}, Targets: []Target{{Model: "x"}, {Model: "y"}}},
		{Models: []string{"o"}, Targets: []Target{{Model: "p", Weight: 1}, {Model: "q"}}},
	}}
	require.ErrorIs(t, rw.Validate(), ErrMixedWeights)
	mixed, err := rw.Check()
	require.NoError(t, err)
	require.Len(t, mixed, 2)
	assert.ErrorIs(t, mixed[0], ErrMixedWeights)
	assert.Equal(t, ".rules[0].targets: weights are set on every target of a rule or on none: 2 of 5 have one", mixed[0].Error())
	assert.Equal(t, ".rules[2].targets: weights are set on every target of a rule or on none: 1 of 2 have one", mixed[1].Error())
	_, err = Rewrite{Name: "x", Rules: []Rule{{Targets: []Target{{Model: "a", Weight: 1}, {Model: ""}}}}}.Check()
	assert.ErrorIs(t, err, ErrModel, "Check refuses what Validate refuses, mixed weights aside")

	// Every draw of the sum of weights (4) lands on a weighted target: [0, 3) on v1,
	// 3 on v2.
	table := NewTable(nil, &script{values: []int64{0, 1, 2, 3, 0, 1, 0}}, nil)
	table.SetCluster([]Rewrite{rw})
	var got []string
	for range 4 {
		c, ok := table.Choose("m")
		require.True(t, ok)
		got = append(got, c.Target)
	}
	assert.Equal(t, []string{"v1", "v1", "v1", "v2"}, got)
	for _, want := range []string{"x", "y"} {
		c, _ := table.Choose("n")
		assert.Equal(t, want, c.Target, "unweighted: uniform")
	}
	c, _ := table.Choose("o")
	assert.Equal(t, "p", c.Target)
}

// TestSeriesOfRewritesNoLongerInForceAreDropped: a rewrite removed (a canary's
// InferenceModelRewrite deleted, a config reloaded) or a target taken out of it takes
// its series with it, so names churned through over months do not pile up series; the
// rest keep counting.
func TestSeriesOfRewritesNoLongerInForceAreDropped(t *testing.T) {
	reg := prometheus.NewRegistry()
	table := NewTable(Config{
		split("canary", []string{"m"}, Target{Model: "v1", Weight: 1}, Target{Model: "v2", Weight: 1}),
		alias("alias", "o", "o-v1"),
	}, &script{values: []int64{0, 1, 0}}, NewMetrics(reg))
	for _, model := range []string{"m", "m", "o"} {
		_, ok := table.Choose(model)
		require.True(t, ok)
	}
	require.Equal(t, 3, testutil.CollectAndCount(table.metrics.chosen))

	table.SetConfigured(Config{split("canary", []string{"m"}, Target{Model: "v2"})})
	assert.Equal(t, 1, testutil.CollectAndCount(table.metrics.chosen), "the alias and canary/v1 are gone")
	assert.InDelta(t, 1, testutil.ToFloat64(table.metrics.chosen.WithLabelValues("canary", "v2")), 0, "a target still in force keeps its count")

	table.SetCluster([]Rewrite{alias("canary", "m", "v3")}) // the cluster's replaces the config's of that name
	assert.Zero(t, testutil.CollectAndCount(table.metrics.chosen))
}
