package onetoken

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/hf"
)

func TestEveryWordIsOneToken(t *testing.T) {
	qwen3, err := hf.LoadBuiltin("qwen3")
	require.NoError(t, err)
	ws := Words()
	require.Greater(t, len(ws), 1000)
	assert.True(t, sort.StringsAreSorted(ws))
	for _, w := range ws {
		ids, err := qwen3.Encode(" "+w, false)
		require.NoError(t, err)
		assert.Len(t, ids, 1, "qwen3 %q", " "+w)
		ids, err = qwen3.Encode("\n"+w, false)
		require.NoError(t, err)
		assert.Len(t, ids, 2, "qwen3 %q", "\n"+w)
		ids, err = tokenize.Approx{}.Encode(" "+w, false)
		require.NoError(t, err)
		assert.Len(t, ids, 1, "approx %q", " "+w)
	}
}
