package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPeakRSSIsNoLowerThanAnyReading: the kernel updates VmHWM lazily, so a peak that
// a sample caught in VmRSS may be gone from a later VmHWM (a CI run reported a peak 192
// KB below the highest VmRSS it sampled); the reported peak is the highest of either
// ever read.
func TestPeakRSSIsNoLowerThanAnyReading(t *testing.T) {
	readings := []procStat{
		{rss: 100, hwm: 100}, // the warm-up's end
		{rss: 200, hwm: 150}, // a peak VmHWM has not caught up with
		{rss: 120, hwm: 150}, // the load's end
		{rss: 110, hwm: 150}, // after the drain
	}
	next := 0
	p := &procSampler{read: func(int) (procStat, error) {
		s := readings[next]
		next++
		return s, nil
	}}
	p.markWarm()
	p.take()
	p.end()
	r := p.report()
	assert.Equal(t, int64(200), r.MaxRSSMeasured)
	assert.Equal(t, int64(200), r.PeakRSS)
}
