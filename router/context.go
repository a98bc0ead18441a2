package router

// ContextLengths says how many tokens each worker's engine takes in one sequence, its
// context (vLLM's --max-model-len): an engine refuses a prompt of that many tokens or
// more with a 400, before computing any of it. *enginemodels.Lister satisfies it
// (from each engine's /v1/models).
type ContextLengths interface {
	// ContextLength returns the context of model on worker's engine, and whether it is
	// known.
	ContextLength(worker, model string) (int, bool)
}

// MaxContextLength bounds workers[].max_model_len (2³¹ − 1 tokens).
const MaxContextLength = 1<<31 - 1

// contextFit is what a decision's check of the prompt against the candidates' contexts
// did.
type contextFit struct {
	// narrowed: some candidates were left out, their context too short for the prompt.
	narrowed bool
	// exceeded: the prompt passes every candidate's context, so whichever is chosen
	// refuses it: nothing is booked or recorded for it.
	exceeded bool
}

// contextLength returns w's context for model: its config's max_model_len, else its
// engine's list's, 0 when unknown.
func (r *Router) contextLength(w Worker, model string) int {
	if w.MaxModelLen > 0 {
		return w.MaxModelLen
	}
	if r.deps.ContextLengths != nil {
		if n, ok := r.deps.ContextLengths.ContextLength(w.Name, model); ok {
			return n
		}
	}
	return 0
}

// fitContext leaves out of dest the workers whose engines would refuse a prompt of
// promptTokens exact ids (at least their context), when some other destination may take
// it (its context longer, or unknown), and the prefill workers that would refuse it
// whatever. When no destination may, dest is kept whole and the decision is marked
// exceeded: the request still goes where the cost sends it, and the engine answers its
// 400, which kvroute does not write for it. Both slices are filtered in place.
func (r *Router) fitContext(model string, promptTokens int, dest, prefills []Worker) ([]Worker, []Worker, contextFit) {
	fits := func(w Worker) bool {
		n := r.contextLength(w, model)
		return n == 0 || promptTokens < n
	}
	var fit contextFit
	kept := 0
	for _, w := range dest {
		if fits(w) {
			dest[kept] = w
			kept++
		}
	}
	switch {
	case kept == 0:
		fit.exceeded = true // dest untouched: kept counted without moving a worker
	case kept < len(dest):
		fit.narrowed = true
		dest = dest[:kept]
	}
	kept = 0
	for _, w := range prefills {
		if fits(w) {
			prefills[kept] = w
			kept++
		}
	}
	return dest, prefills[:kept], fit
}

// capToContext bounds the prefill tokens booked on w: its engine computes no more than
// its context of any prompt (a longer one it refuses), so a prompt whose length is
// partly estimated (a cut encoding's rest) or approximate books no more than that.
func (r *Router) capToContext(tokens int, w Worker, model string) int {
	if n := r.contextLength(w, model); n > 0 {
		return min(tokens, n)
	}
	return tokens
}
