package discovery

import (
	"context"
	"slices"

	"github.com/kvroute/kvroute/router"
)

// Static is the config file's `workers` list: a set known before it runs, which changes
// only through a config reload.
type Static struct{ workers []router.Worker }

var _ Preloaded = (*Static)(nil)

// NewStatic returns the static source of workers.
func NewStatic(workers []router.Worker) *Static { return &Static{workers: slices.Clone(workers)} }

// Workers returns the configured workers.
func (s *Static) Workers() []router.Worker { return slices.Clone(s.workers) }

// Run reports the workers once and waits for ctx: reloads reach the fleet through the
// config reloader, not through discovery.
func (s *Static) Run(ctx context.Context, sink Sink) error {
	sink.Update(s.Workers())
	<-ctx.Done()
	return ctx.Err()
}
