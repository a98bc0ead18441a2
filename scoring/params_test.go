package scoring

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryWeightIsSettableValidatedAndOverridable walks Params' fields, so a weight
// added to the struct but left out of Set's map, Validate's list or the JSON tags (the
// policy API and per-route overrides decode JSON) fails here.
func TestEveryWeightIsSettableValidatedAndOverridable(t *testing.T) {
	typ := reflect.TypeFor[Params]()
	var weights []string
	for f := range typ.Fields() {
		if f.Type.Kind() != reflect.Float64 {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		require.Equal(t, name, f.Tag.Get("json"), "%s: YAML and JSON name it alike", f.Name)
		weights = append(weights, f.Name)
		t.Run(name, func(t *testing.T) {
			field := func(p *Params) float64 { return reflect.ValueOf(p).Elem().FieldByName(f.Name).Float() }

			var set Params
			require.NoError(t, set.Set(name, "0.5"), "Set knows it")
			assert.Equal(t, 0.5, field(&set))

			applied, err := Params{}.ApplyJSON(fmt.Appendf(nil, `{%q: 0.5}`, name))
			require.NoError(t, err, "a policy update or route override can name it")
			assert.Equal(t, 0.5, field(&applied))

			bad := Params{}
			reflect.ValueOf(&bad).Elem().FieldByName(f.Name).SetFloat(-1)
			var fe *FieldError
			require.ErrorAs(t, bad.Validate(), &fe, "Validate checks it")
			assert.Equal(t, name, fe.Field)
		})
	}
	assert.Contains(t, weights, "InterferenceWeight")
}
