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

// Run waits for ctx: the runner applied the workers when it was built (Static is
// Preloaded), and later lists arrive by config reload, through Runner.Apply. Reporting
// them again here could undo a reload that came first.
func (s *Static) Run(ctx context.Context, _ Sink) error {
	<-ctx.Done()
	return ctx.Err()
}
