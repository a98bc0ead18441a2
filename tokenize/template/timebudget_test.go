package template

import (
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// stepClock is a clock that moves on by tick at each reading, so a render's time budget
// runs out after a known number of loop iterations, whatever the machine.
type stepClock struct {
	t     time.Time
	tick  time.Duration
	reads int
}

func (c *stepClock) now() time.Time {
	c.reads++
	c.t = c.t.Add(c.tick)
	return c.t
}

// TestEveryLoopIterationChecksTheTimeBudget: compile puts the budget's step at the start
// of every for loop's body (top level, nested, in a macro, a set block, a filter block,
// a filtered loop, a loop with an else branch), once per iteration, and the step prints
// nothing: the output is the library's without it.
func TestEveryLoopIterationChecksTheTimeBudget(t *testing.T) {
	const src = `{%- macro m(xs) %}{% for x in xs %}[{{ x }}]{% endfor %}{% endmacro -%}
{% for a in items %}
  {{- a -}}
  {% for b in items if b > 1 %}({{ a }}{{ b }}){% endfor %}
{% endfor %}
{{ m(items) }}
{%- set s %}{% for x in items %}{{ x }}{% endfor %}{% endset %}{{ s }}
{% filter upper %}{% for x in ['a', 'b'] %}{{ x }}{% endfor %}{% endfilter %}
{% for x in [] %}never{% else %}empty{% endfor %}`
	bound, err := compileSource(src, true)
	require.NoError(t, err)
	lib, err := compileSource(src, false)
	require.NoError(t, err)
	items := jinja.NewList([]jinja.Value{jinja.NewInt(1), jinja.NewInt(2), jinja.NewInt(3)})

	want, err := lib.RenderValues(map[string]jinja.Value{"items": items})
	require.NoError(t, err)
	clock := &stepClock{t: time.Unix(0, 0), tick: time.Nanosecond}
	budget := &timeBudget{deadline: time.Unix(1, 0), now: clock.now}
	data := map[string]jinja.Value{"items": items}
	budget.bind(data)
	got, err := bound.RenderValues(data)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	// 3 outer, 3×2 inner (the items the loop's filter keeps), 3 in the macro, 3 in the
	// set block, 2 in the filter block, none in the empty loop.
	assert.Equal(t, 3+3*2+3+3+2, clock.reads)
	assert.False(t, budget.exceeded)
}

// TestRenderPastItsTimeBudgetIsRefused: a render through the library still running at
// MaxRenderTime ends at its next loop iteration with ErrRenderTooSlow; one within it
// renders as ever. The direct renderers, linear, have no budget.
func TestRenderPastItsTimeBudgetIsRefused(t *testing.T) {
	r, err := New(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`, Tokens{}, Options{MaxRenderTime: 100 * time.Millisecond})
	require.NoError(t, err)
	clock := &stepClock{t: time.Unix(0, 0), tick: time.Millisecond}
	r.clock = clock.now

	chat := func(n int) *tokenize.Chat {
		c := tokenize.TextChat("user", "x")
		for len(c.Messages) < n {
			c.Messages = append(c.Messages, c.Messages[0])
		}
		return c
	}
	out, err := r.Render(chat(90))
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("<user>x", 90), out)

	reads := clock.reads
	_, err = r.Render(chat(1000))
	require.ErrorIs(t, err, ErrRenderTooSlow)
	assert.NotErrorIs(t, err, ErrRender)
	assert.Less(t, clock.reads-reads, 110, "stopped at the deadline, not after the whole chat")

	_, err = New(`x`, Tokens{}, Options{MaxRenderTime: -1})
	require.Error(t, err)
}
