package background

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/logbuf"
)

func TestDoRecoversAPanicAsAnErrorThatIsLoggedAndCounted(t *testing.T) {
	errFailed := errors.New("failed")
	tests := []struct {
		name       string
		unit       func() error
		wantErr    error // errors.Is
		wantText   string
		wantPanics float64
	}{
		{name: "a unit that returns passes its result on", unit: func() error { return nil }},
		{name: "a unit's own error is returned as is", unit: func() error { return errFailed }, wantErr: errFailed},
		{name: "a panic is an error naming its value", unit: func() error { panic("injected fault") },
			wantErr: ErrPanicked, wantText: "panicked: injected fault", wantPanics: 1},
		{name: "a runtime error too", unit: func() error { var m map[string]int; m["x"]++; return nil },
			wantErr: ErrPanicked, wantText: "assignment to entry in nil map", wantPanics: 1},
		{name: "and a panic with a nil value", unit: func() error { panic(nil) }, wantErr: ErrPanicked, wantPanics: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			var logs logbuf.Buffer
			g := NewGuard(LoopScrape, slog.New(slog.NewTextHandler(&logs, nil)), m)

			err := g.Do(tt.unit)
			if tt.wantErr == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tt.wantErr)
				assert.ErrorContains(t, err, tt.wantText)
			}
			assert.Equal(t, tt.wantPanics, testutil.ToFloat64(m.panics.WithLabelValues(LoopScrape)))
			if tt.wantPanics == 0 {
				assert.Empty(t, logs.String())
				return
			}
			assert.Contains(t, logs.String(), "level=ERROR")
			assert.Contains(t, logs.String(), "loop=scrape")
			assert.Contains(t, logs.String(), "background_test.go", "the stack is logged")
		})
	}
}

func TestDoRunsTheUnitsDefersBeforeReturning(t *testing.T) {
	released := false
	err := NewGuard(LoopHealth, nil, nil).Do(func() error {
		defer func() { released = true }()
		panic("injected fault")
	})
	require.ErrorIs(t, err, ErrPanicked)
	assert.True(t, released, "a lock released by a defer in the unit is free again")
}

func TestTheZeroGuardAndNilMetricsRecoverAndRecordNothing(t *testing.T) {
	assert.ErrorIs(t, Guard{}.Do(func() error { panic("injected fault") }), ErrPanicked)
	assert.Nil(t, NewMetrics(nil))
}

func TestAGuardsLoopCountsFromZeroAndTheSeriesLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	NewGuard(LoopKVEvents, nil, m)
	NewGuard(LoopPeers, nil, m)
	assert.Equal(t, 2, testutil.CollectAndCount(m.panics), "one series per loop guarded, at 0 before any panic")
	problems, err := testutil.CollectAndLint(m.panics)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
