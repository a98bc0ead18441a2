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
func (r *Router) contextLength(w *Worker, model string) int {
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
// promptTokens exact ids, when some other destination may take it (its context longer,
// or unknown), and the prefill workers that would refuse it whatever. An engine refuses
// a prompt of its context or more tokens, and, with a bound on the output (maxTokens,
// not 0), one whose tokens plus the bound pass its context (vLLM, and SGLang unless
// it trims the bound).
// The destinations where both fit are kept when there are any, else those where the
// prompt alone does: an engine that trims the output to its context (SGLang's
// --allow-auto-truncate) serves it, so only a prompt that reaches every destination's
// context is taken as refused. Then dest is kept whole and the decision is marked
// exceeded: the request is routed by load, and the engine answers its 400, which
// kvroute does not write for it. A prefill worker is asked for one token
// (the P/D sidecar's max_tokens 1): the prompt alone must fit it. Both slices are
// filtered in place.
func (r *Router) fitContext(model string, promptTokens int, maxTokens int64, dest, prefills []Worker) ([]Worker, []Worker, contextFit) {
	fitsPrompt := func(n int) bool { return n == 0 || promptTokens < n }
	fitsOutput := func(n int) bool {
		return fitsPrompt(n) && (n == 0 || maxTokens <= int64(n-promptTokens))
	}
	var fit contextFit
	kept := keepFitting(dest, func(w *Worker) bool { return fitsOutput(r.contextLength(w, model)) })
	if kept == 0 && maxTokens > 0 {
		kept = keepFitting(dest, func(w *Worker) bool { return fitsPrompt(r.contextLength(w, model)) })
	}
	switch {
	case kept == 0:
		fit.exceeded = true // dest untouched: no worker was kept, so none moved
	case kept < len(dest):
		fit.narrowed = true
		dest = dest[:kept]
	}
	kept = keepFitting(prefills, func(w *Worker) bool { return fitsPrompt(r.contextLength(w, model)) })
	return dest, prefills[:kept], fit
}

// keepFitting moves the workers fits keeps to the front of workers, in order, and
// returns how many it kept; with none kept, workers is unchanged. A worker is copied
// only to move it (a decision's candidates are each checked, and mostly kept).
func keepFitting(workers []Worker, fits func(*Worker) bool) int {
	kept := 0
	for i := range workers {
		if fits(&workers[i]) {
			if kept != i {
				workers[kept] = workers[i]
			}
			kept++
		}
	}
	return kept
}

// capToContext bounds the prefill tokens booked on w: its engine computes no more than
// its context of any prompt (a longer one it refuses), so a prompt whose length is
// partly estimated (a cut encoding's rest) or approximate books no more than that.
func (r *Router) capToContext(tokens int, w Worker, model string) int {
	if n := r.contextLength(&w, model); n > 0 {
		return min(tokens, n)
	}
	return tokens
}
