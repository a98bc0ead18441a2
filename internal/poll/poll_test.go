package poll

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryCallsAtOnceThenEachIntervalUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan struct{})
	go func() {
		Every(ctx, time.Millisecond, func(context.Context) { calls.Add(1) })
		close(done)
	}()
	require.Eventually(t, func() bool { return calls.Load() >= 3 }, 10*time.Second, time.Millisecond)
	cancel()
	<-done // Every returns once cancelled

	var once atomic.Int32
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	Every(cancelled, time.Hour, func(context.Context) { once.Add(1) })
	assert.Equal(t, int32(1), once.Load(), "the first call happens at once, even when already cancelled")
}
