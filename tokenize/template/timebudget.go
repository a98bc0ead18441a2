package template

import (
	"errors"
	"time"

	"github.com/ardanlabs/jinja"
)

// DefaultMaxRenderTime bounds a render through the Jinja library when
// Options.MaxRenderTime is 0.
//
// Chat templates are trusted, but some cost the square of what a chat holds: granite4's
// builds its system prompt by string concatenation, one copy of the whole text so far
// for each tool, document and content part; the DeepSeek templates concatenate every
// system message so. A body within max_body_bytes and the parser's value budget then
// costs seconds to minutes of CPU (a 512 KiB body of documents, 8.5 s with granite4;
// docs/BENCHMARKS.md "Hostile chats and the render's CPU"), while a real chat renders
// in well under 10 ms. The library has no step budget, so each template's loops are
// given one (stepFunc).
const DefaultMaxRenderTime = 500 * time.Millisecond

// stepFunc is the name of the call compile puts at the start of every for loop's body:
// it checks the render's time budget at each iteration, so a render stops within one
// iteration of its deadline whatever the template's loops do.
const stepFunc = "__kvroute_step"

// stepTag is what compile writes after each {% for %} tag: the call prints nothing.
const stepTag = "{{" + stepFunc + "()}}"

// errRenderTime ends a render past its deadline; the renderer reports it as
// ErrRenderTooSlow.
var errRenderTime = errors.New("render past its time budget")

// timeBudget is one render's deadline, checked at each loop iteration.
type timeBudget struct {
	deadline time.Time
	now      func() time.Time
	// exceeded is set once a step found the deadline past; every later step fails too,
	// so a template that swallows the error still ends.
	exceeded bool
}

var emptyString = jinja.NewString("")

// bind sets the render's step function among the template variables.
func (b *timeBudget) bind(data map[string]jinja.Value) {
	data[stepFunc] = jinja.NewCallable(stepFunc, b.step)
}

func (b *timeBudget) step([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	if b.exceeded || b.now().After(b.deadline) {
		b.exceeded = true
		return jinja.Undefined(), errRenderTime
	}
	return emptyString, nil
}
