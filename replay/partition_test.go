package replay

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPartitionPlacesNewSessionsByItsDigitsAndNeverMovesThem(t *testing.T) {
	const digits = "0110100110010110"
	res, log := runLogged(t, workloadA("partition:"+digits, 3), NewSessions(DefaultSessions(), 3))
	assert.Equal(t, 0, res.MovedTurns)
	var first []RequestLine
	worker := map[int]int{}
	for _, r := range log.requests {
		if r.Turn == 1 {
			first = append(first, r)
			worker[r.Session] = r.Worker
		}
	}
	slices.SortStableFunc(first, byArrival)
	require.Len(t, first, len(digits))
	for i, r := range first {
		assert.Equal(t, int(digits[i]-'0'), r.Worker, "new session %d", i+1)
	}
	for _, r := range log.requests {
		assert.Equal(t, worker[r.Session], r.Worker, "session %d turn %d", r.Session, r.Turn)
	}
}

func TestPartitionOfTheDefaultsPlacementReproducesIt(t *testing.T) {
	// kvroute splits Workload A's seed-3 sessions this way (first turns in arrival
	// order) and never moves one: the oracle with the same split is the same run.
	_, log := runLogged(t, workloadA("kvroute", 3), NewSessions(DefaultSessions(), 3))
	var first []RequestLine
	for _, r := range log.requests {
		if r.Turn == 1 {
			first = append(first, r)
		}
	}
	slices.SortStableFunc(first, byArrival)
	digits := ""
	for _, r := range first {
		digits += string(rune('0' + r.Worker))
	}
	kvroute, err := Run(workloadA("kvroute", 3), NewSessions(DefaultSessions(), 3))
	require.NoError(t, err)
	oracle, err := Run(workloadA("partition:"+digits, 3), NewSessions(DefaultSessions(), 3))
	require.NoError(t, err)
	assert.Equal(t, kvroute.RecomputedPrefillTokens, oracle.RecomputedPrefillTokens)
	assert.Equal(t, kvroute.ResumedTTFTP95ms, oracle.ResumedTTFTP95ms)
}

func TestPartitionRefusesWhatItCannotPlace(t *testing.T) {
	tests := []struct {
		name, policy, wantErr string
		atRun                 bool
	}{
		{"no digits", "partition:", "needs one worker digit per new prefix", false},
		{"not a digit", "partition:01x", `'x' is not a worker digit`, false},
		{"more sessions than digits", "partition:0101", "new prefix 5 has no worker (4 given)", true},
		{"a worker past the candidates", "partition:0102010101010101", "worker 2 of 2 candidates", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPicker(tt.policy, nil)
			if !tt.atRun {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			_, err = Run(workloadA(tt.policy, 1), NewSessions(DefaultSessions(), 1))
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// byArrival orders request lines by arrival time: the order the router saw them in.
func byArrival(a, b RequestLine) int {
	switch {
	case a.ArrivalMs < b.ArrivalMs:
		return -1
	case a.ArrivalMs > b.ArrivalMs:
		return 1
	}
	return 0
}
