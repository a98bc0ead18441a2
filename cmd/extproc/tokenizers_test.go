package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestTheDefaultTokenizerLoadsAtStartWhenAWorkerMayNeedIt: the embedded default is
// deferred only when the config shows no worker can be asked for a model without an
// entry.
func TestTheDefaultTokenizerLoadsAtStartWhenAWorkerMayNeedIt(t *testing.T) {
	entries := models.Config{"a": {Approx: true}, "b": {Approx: true}}
	tests := []struct {
		name      string
		workers   []router.Worker
		discovery string
		want      bool
	}{
		{"every served model has an entry", []router.Worker{{Models: []string{"a"}}, {Models: []string{"a", "b"}}}, discovery.SourceStatic, false},
		{"a served model has none", []router.Worker{{Models: []string{"a"}}, {Models: []string{"c"}}}, discovery.SourceStatic, true},
		{"a worker serves any model", []router.Worker{{Models: []string{"a"}}, {}}, discovery.SourceStatic, true},
		{"discovered workers are not known at start", []router.Worker{{Models: []string{"a"}}}, discovery.SourceFile, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Tokenizers, cfg.Router.Workers, cfg.Discovery.Source = entries, tt.workers, tt.discovery
			assert.Equal(t, tt.want, mayServeModelsWithoutEntry(cfg))
		})
	}
}
