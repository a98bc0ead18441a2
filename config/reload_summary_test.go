package config

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
)

func TestAReloadSummaryListsNothingAsEmptyLists(t *testing.T) {
	tests := []struct {
		name    string
		summary Summary
		want    string
	}{
		{"nothing changed", Summary{Diff: fleet.Diff{Workers: 2}}, `{"workers":2,"added":[],"removed":[],"changed":[],"policy":false}`},
		{"a worker added, the policy replaced", Summary{Diff: fleet.Diff{Workers: 3, Added: []string{"w3"}}, Policy: true},
			`{"workers":3,"added":["w3"],"removed":[],"changed":[],"policy":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.summary)
			require.NoError(t, err)
			assert.JSONEq(t, tt.want, string(got))
			var through any = tt.summary // the admin port encodes it as an any
			got, err = json.Marshal(through)
			require.NoError(t, err)
			assert.JSONEq(t, tt.want, string(got))
		})
	}
}
