package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
)

// The model_rewrites section: read strictly, its errors name the key, and a reload may
// change it alone, applied to the table.
func TestModelRewritesSection(t *testing.T) {
	cfg, err := Parse([]byte(minimal + `
model_rewrites:
  - name: canary
    rules:
      - models: [small-segment-lora]
        targets:
          - {model: small-segment-lora-v1, weight: 90}
          - {model: small-segment-lora-v2, weight: 10}
  - name: fallback
    rules:
      - targets: [{model: base}]
`))
	require.NoError(t, err)
	assert.Equal(t, rewrite.Config{
		{Name: "canary", Rules: []rewrite.Rule{{Models: []string{"small-segment-lora"}, Targets: []rewrite.Target{
			{Model: "small-segment-lora-v1", Weight: 90}, {Model: "small-segment-lora-v2", Weight: 10}}}}},
		{Name: "fallback", Rules: []rewrite.Rule{{Targets: []rewrite.Target{{Model: "base"}}}}},
	}, cfg.ModelRewrites)

	for _, tt := range []struct{ name, yaml, want string }{
		{"unknown key", "model_rewrites: [{name: x, rules: [{matches: [a], targets: [{model: b}]}]}]\n", "field matches not found"},
		{"no targets", "model_rewrites: [{name: x, rules: [{models: [a]}]}]\n", "model_rewrites[0].rules[0].targets: a rule needs at least one target"},
		{"mixed weights", "model_rewrites: [{name: x, rules: [{targets: [{model: a, weight: 1}, {model: b}]}]}]\n", "model_rewrites[0].rules[0].targets: weights are set on every target"},
		{"weight past int32", "model_rewrites: [{name: x, rules: [{targets: [{model: a, weight: 3000000000}]}]}]\n", "cannot unmarshal"},
		{"duplicate name", "model_rewrites: [{name: x, rules: [{targets: [{model: a}]}]}, {name: x, rules: [{targets: [{model: b}]}]}]\n", "model_rewrites[1].name: another rewrite has this name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(minimal + tt.yaml))
			assert.ErrorContains(t, err, tt.want)
		})
	}

	next := cfg
	next.ModelRewrites = nil
	assert.Empty(t, RestartKeys(cfg, next), "model_rewrites are reloaded")
}

// workersFleet is a fleet of no workers that refuses to change.
type workersFleet struct{}

func (workersFleet) Apply([]router.Worker) (fleet.Diff, error) { panic("the fleet follows discovery") }
func (workersFleet) Workers() []router.Worker                  { return nil }

type recordedRewrites struct{ sets []rewrite.Config }

func (r *recordedRewrites) SetConfigured(c rewrite.Config) { r.sets = append(r.sets, c) }

// A reload applies a changed model_rewrites section, and only a changed one.
func TestReloadAppliesModelRewrites(t *testing.T) {
	running, err := Parse([]byte(minimal))
	require.NoError(t, err)
	running.Discovery.Source = "file" // the fleet is not the file's to change
	next := running
	next.ModelRewrites = rewrite.Config{{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"a"}, Targets: []rewrite.Target{{Model: "b"}}}}}}
	load := func() (Config, error) { return next, nil }
	rec := &recordedRewrites{}
	r := NewReloader(running, load, Targets{Fleet: workersFleet{}, Rewrites: rec}, nil, nil)

	summary, err := r.Reload()
	require.NoError(t, err)
	assert.True(t, summary.ModelRewrites)
	assert.Equal(t, []rewrite.Config{next.ModelRewrites}, rec.sets)

	summary, err = r.Reload()
	require.NoError(t, err)
	assert.False(t, summary.ModelRewrites, "unchanged: not applied again")
	assert.Len(t, rec.sets, 1)
}
