package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

// The property test of which workers may serve a request (listFilter, through Route):
// 2000 random small fleets (1 to 5 workers: roles, models or open or an event topic,
// own lora_adapters, engine lists unknown or known, lora_on_demand, a GIE subset,
// workers out for health) and a request for a base model or an adapter each. Every
// decision's outcome, destinations (Address and FallbackAddresses: the kv-cost picker
// returns every candidate), prefill candidates, AllOut and unlisted flags are compared
// with a reference written from the README's rules ("Which worker serves which model",
// "LoRA adapters"), and the invariants those rules promise are checked on their own:
//   - the lists never refuse: the outcome is the one without lists (same resolution);
//   - a candidate whose list leaves the model (the adapter) out only under a decision
//     marked model_unlisted (lora_unlisted or model_unlisted), and never while a
//     reachable healthy destination has evidence;
//   - never a prefill worker, one outside the subset, out for health (unless every one
//     is), or one whose own lora_adapters leave the adapter out.

// Small vocabularies, so that fleets often agree and disagree on a name.
var (
	propBases    = []string{"qwen", "llama"}            // what workers' models name
	propAskBases = []string{"qwen", "llama", "mistral"} // what requests and lists name
	propDeclared = []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}, {Name: "poem", BaseModel: "llama"}}
	propAdapters = []string{"sql", "chat", "poem", "tools"} // tools: declared nowhere
)

// propList is one engine's model list as its /v1/models cards give it: base models
// (cards without a parent) and adapters with their parent.
type propList struct {
	bases    []string
	adapters map[string]string
}

// propLists are the engines' lists with enginemodels.Lister's semantics: a worker
// absent has no known list; an adapter's parent is a base model its engine serves;
// BaseOf gives an adapter's one parent unless some list serves the name as a base.
type propLists map[string]propList

func (p propLists) listedBase(worker, model string) (serves, known bool) {
	l, known := p[worker]
	if !known {
		return false, false
	}
	if slices.Contains(l.bases, model) {
		return true, true
	}
	for _, parent := range l.adapters {
		if parent == model {
			return true, true
		}
	}
	return false, true
}

func (p propLists) ServesModel(worker, model string) (bool, bool) { return p.listedBase(worker, model) }

func (p propLists) ServesAdapter(worker, adapter string) (bool, bool) {
	l, known := p[worker]
	_, serves := l.adapters[adapter]
	return serves, known
}

func (p propLists) BaseOf(adapter string) (string, bool) {
	parents := map[string]bool{}
	for w, l := range p {
		if served, _ := p.listedBase(w, adapter); served {
			return "", false
		}
		if parent, ok := l.adapters[adapter]; ok {
			parents[parent] = true
		}
	}
	if len(parents) != 1 {
		return "", false
	}
	for parent := range parents {
		return parent, true
	}
	panic("unreachable")
}

// propCase is one random fleet and request.
type propCase struct {
	workers  []Worker
	lists    propLists // nil: no ModelLists at all
	onDemand bool
	out      outSet
	subset   []string
	model    string // as the client names it
}

func (c propCase) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "request model=%q subset=%q onDemand=%v out=%v lists=%v\n", c.model, c.subset, c.onDemand, c.out, c.lists != nil)
	for _, w := range c.workers {
		topic := ""
		if w.KVEvents != nil {
			topic = w.KVEvents.Topic
		}
		fmt.Fprintf(&b, "  %s %s role=%q models=%q topic=%q own=%q", w.Name, w.Address, w.Role, w.Models, topic, w.LoRAAdapters)
		if c.lists != nil {
			if l, ok := c.lists[w.Name]; ok {
				fmt.Fprintf(&b, " list{bases=%q adapters=%v}", l.bases, l.adapters)
			} else {
				b.WriteString(" list unknown")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func pickSome[T any](rng *rand.Rand, from []T, p float64) []T {
	var out []T
	for _, x := range from {
		if rng.Float64() < p {
			out = append(out, x)
		}
	}
	return out
}

func randomPropCase(rng *rand.Rand) propCase {
	var c propCase
	n := 1 + rng.IntN(5)
	bases := adapterBases(propDeclared)
	for i := range n {
		w := Worker{Name: fmt.Sprint("w", i), Address: fmt.Sprint("127.0.0.1:", 8000+i)}
		switch k := rng.Float64(); {
		case k < 0.4: // open: serves what its engine lists
		case k < 0.85:
			w.Models = pickSome(rng, propBases, 0.5)
			if len(w.Models) == 0 {
				w.Models = []string{propBases[rng.IntN(len(propBases))]}
			}
		default: // event mode: the topic names its one model
			w.KVEvents = &KVEvents{Endpoint: "tcp://{ip}:5557", Topic: "kv@{ip}@" + propBases[rng.IntN(len(propBases))]}
		}
		if rng.Float64() < 0.35 {
			for _, a := range pickSome(rng, propDeclared, 0.5) {
				if w.serves(bases[a.Name]) {
					w.LoRAAdapters = append(w.LoRAAdapters, a.Name)
				}
			}
		}
		w.Role = []string{"", RoleDecode, RoleBoth, RolePrefill}[rng.IntN(4)]
		c.workers = append(c.workers, w)
	}
	if rng.Float64() < 0.8 {
		c.lists = propLists{}
		for _, w := range c.workers {
			if rng.Float64() < 0.3 {
				continue // unknown
			}
			l := propList{bases: pickSome(rng, propAskBases, 0.4), adapters: map[string]string{}}
			for _, a := range pickSome(rng, propAdapters, 0.35) {
				parent := bases[a]
				if parent == "" || rng.Float64() < 0.1 { // tools, or a same-named adapter of another model
					parent = propBases[rng.IntN(len(propBases))]
				}
				l.adapters[a] = parent
			}
			c.lists[w.Name] = l
		}
	}
	c.onDemand = rng.Float64() < 0.25
	c.out = outSet{}
	for _, w := range c.workers {
		if rng.Float64() < 0.2 {
			c.out[w.Name] = true
		}
	}
	if rng.Float64() < 0.3 {
		c.subset = []string{} // not nil: a hint, possibly naming nothing
		for _, w := range c.workers {
			if rng.Float64() < 0.6 {
				c.subset = append(c.subset, w.Address)
			}
		}
	}
	if rng.Float64() < 0.5 {
		c.model = propAskBases[rng.IntN(len(propAskBases))]
	} else {
		c.model = propAdapters[rng.IntN(len(propAdapters))]
	}
	return c
}

// Outcome classes.
const (
	propOK          = "ok"
	propNotFound    = "model_not_found"
	propNoWorkers   = "no_workers"
	propOnlyPrefill = "only_prefill"
)

func errClass(err error) string {
	switch {
	case err == nil:
		return propOK
	case errors.Is(err, ErrOnlyPrefillWorkers):
		return propOnlyPrefill
	case errors.Is(err, ErrNoWorkers):
		return propNoWorkers
	case errors.Is(err, ErrModelNotFound):
		return propNotFound
	}
	return "other: " + err.Error()
}

// propWant is what the rules say of a request: its outcome, the destinations it may go
// to (by name, in configured order), the prefill workers that may compute it, and the
// unlisted flags.
type propWant struct {
	class                        string
	base, lora                   string
	dests, prefills              []string
	prefillFleet, allOut         bool
	modelUnlisted, loraUnlisted  bool
	step                         int // 1: the lists as they are, 2: adapter lists set aside, 3: all lists set aside
	baseMay, adapterMay, allowed map[string]bool
}

// propReference applies the README's rules to c directly: no listFilter, no verdicts.
func propReference(c propCase) propWant {
	var want propWant
	lists := c.lists
	// Which model, which adapter: a declared adapter runs on its declared base; a name
	// a worker's models or an engine's base-model list gives stays a model; else an
	// adapter the lists give one parent runs on that parent.
	want.base = c.model
	if base, ok := adapterBases(propDeclared)[c.model]; ok {
		want.base, want.lora = base, c.model
	} else if lists != nil {
		servedAsModel, asBase, parents := false, false, map[string]bool{}
		for _, w := range c.workers {
			servedAsModel = servedAsModel || slices.Contains(w.Models, c.model)
		}
		for _, l := range lists {
			asBase = asBase || slices.Contains(l.bases, c.model)
			for _, p := range l.adapters {
				asBase = asBase || p == c.model
			}
			if p, ok := l.adapters[c.model]; ok {
				parents[p] = true
			}
		}
		if !servedAsModel && !asBase && len(parents) == 1 {
			for p := range parents {
				want.base, want.lora = p, c.model
			}
		}
	}
	m, a := want.base, want.lora

	configServes := func(w Worker) bool {
		switch {
		case len(w.Models) > 0:
			return slices.Contains(w.Models, m)
		case w.KVEvents != nil:
			return strings.HasSuffix(w.KVEvents.Topic, "@"+m)
		}
		return true
	}
	open := func(w Worker) bool { return len(w.Models) == 0 && w.KVEvents == nil }
	reachable := func(w Worker) bool { // a destination: decode or both, inside the subset
		return w.Role != RolePrefill && (c.subset == nil || slices.Contains(c.subset, w.Address))
	}
	// Per worker configured to serve m: what it may serve and what is evidence it does.
	type facts struct{ baseMay, baseNamed, adapterMay, adapterNamed, ownAllows bool }
	var serving []Worker
	fact := map[string]facts{}
	want.baseMay, want.adapterMay = map[string]bool{}, map[string]bool{}
	for _, w := range c.workers {
		if !configServes(w) {
			continue
		}
		serving = append(serving, w)
		f := facts{baseMay: true, baseNamed: true, adapterMay: true, adapterNamed: true, ownAllows: true}
		if lists != nil && open(w) {
			l, known := lists[w.Name]
			named := known && (slices.Contains(l.bases, m) || slices.Contains(slices.Collect(maps.Values(l.adapters)), m))
			f.baseMay, f.baseNamed = named || !known, named
		}
		switch {
		case a == "":
		case len(w.LoRAAdapters) > 0: // its own list, whatever its engine's says
			own := slices.Contains(w.LoRAAdapters, a)
			f.adapterMay, f.adapterNamed, f.ownAllows = own, own, own
			// Its config names an adapter of m, so its config serves m: evidence, unless
			// its engine's known list leaves m out.
			f.baseNamed = f.baseNamed || (own && f.baseMay)
		case lists != nil && !c.onDemand:
			l, known := lists[w.Name]
			_, named := l.adapters[a]
			f.adapterMay, f.adapterNamed = named || !known, named
		}
		fact[w.Name] = f
		want.baseMay[w.Name], want.adapterMay[w.Name] = f.baseMay, f.adapterMay
	}
	// The steps: each stands when a reachable worker it allows has the evidence it asks.
	steps := []struct {
		allow, evidence func(facts) bool
	}{
		{func(f facts) bool { return f.baseMay && f.adapterMay }, func(f facts) bool { return f.baseNamed && f.adapterNamed }},
		{func(f facts) bool { return f.baseMay && f.ownAllows }, func(f facts) bool { return f.baseNamed }},
		{func(f facts) bool { return f.ownAllows }, func(facts) bool { return true }},
	}
	for i, s := range steps {
		if i == 1 && a == "" {
			continue
		}
		want.step = i + 1
		if slices.ContainsFunc(serving, func(w Worker) bool { return reachable(w) && s.allow(fact[w.Name]) && s.evidence(fact[w.Name]) }) {
			break
		}
	}
	s := steps[want.step-1]
	want.allowed = map[string]bool{}
	for _, w := range serving {
		want.allowed[w.Name] = s.allow(fact[w.Name])
	}
	want.modelUnlisted = want.step == 3
	// README: an adapter no reachable worker of its base model names (own lora_adapters,
	// or a list naming it; with the adapter lists unused, a worker without its own list
	// counts as naming it) is marked lora_unlisted when the adapter lists were set aside.
	// A worker of the base model is one the standing step leaves the request to (with the
	// base-model lists set aside too, every one configured for it).
	want.loraUnlisted = a != "" && want.step >= 2 && !slices.ContainsFunc(serving, func(w Worker) bool {
		return reachable(w) && fact[w.Name].adapterNamed && want.allowed[w.Name]
	})

	// Refusals: no worker configured for the model, or only prefill workers; no worker
	// its own lora_adapters allow.
	switch {
	case len(serving) == 0:
		want.class = propNotFound
		return want
	case !slices.ContainsFunc(serving, func(w Worker) bool { return w.Role != RolePrefill }):
		want.class = propOnlyPrefill
		return want
	case !slices.Contains(slices.Collect(maps.Values(want.allowed)), true):
		want.class = propNotFound
		return want
	}
	var reach []string
	for _, w := range serving {
		if !want.allowed[w.Name] {
			continue
		}
		if w.Role == RolePrefill {
			want.prefillFleet = true
			// Inside the GIE subset, like a destination (it names every endpoint).
			if !c.out[w.Name] && (c.subset == nil || slices.Contains(c.subset, w.Address)) {
				want.prefills = append(want.prefills, w.Name)
			}
			continue
		}
		if reachable(w) {
			reach = append(reach, w.Name)
			if !c.out[w.Name] {
				want.dests = append(want.dests, w.Name)
			}
		}
	}
	allowedDestination := slices.ContainsFunc(serving, func(w Worker) bool { return want.allowed[w.Name] && w.Role != RolePrefill })
	switch {
	case len(reach) == 0 && a != "" && !allowedDestination && want.prefillFleet:
		// Only prefill workers may take the adapter: said as the config error it is.
		want.class = propOnlyPrefill
	case len(reach) == 0:
		want.class = propNoWorkers
	case len(want.dests) == 0: // every one out: health is ignored
		want.dests, want.allOut = reach, true
		want.class = propOK
	default:
		want.class = propOK
	}
	return want
}

// propGot is what Route decided, in the reference's terms.
type propGot struct {
	class                       string
	base, lora                  string
	dests, prefills             []string
	decodeOnly                  string
	allOut                      bool
	modelUnlisted, loraUnlisted bool
}

func propRoute(t *testing.T, c propCase, withLists bool) propGot {
	t.Helper()
	var lists ModelLists
	if withLists && c.lists != nil {
		lists = c.lists
	}
	r := listsRouter(t, Config{Workers: c.workers, LoRAAdapters: propDeclared, LoRAOnDemand: c.onDemand}, lists, c.out)
	params := scoring.DefaultParams()
	params.DisaggregateTokens = 1 // every request with a prefill worker is split: its candidates show
	tokens := make([]uint32, 16)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	d, err := r.Route(context.Background(), &Request{Model: c.model, Tokens: tokens, Subset: c.subset, Params: &params})
	got := propGot{class: errClass(err)}
	if err != nil {
		return got
	}
	defer d.Release()
	byAddress := map[string]string{}
	for _, w := range c.workers {
		byAddress[w.Address] = w.Name
	}
	names := func(addresses ...string) []string {
		var out []string
		for _, w := range c.workers { // configured order
			if slices.Contains(addresses, w.Address) {
				out = append(out, w.Name)
			}
		}
		return out
	}
	got.base, got.lora = d.Model, d.LoRA
	got.dests = names(append([]string{d.Address}, d.FallbackAddresses...)...)
	if d.Prefill != nil {
		got.prefills = names(append([]string{d.Prefill.Address}, d.Prefill.FallbackAddresses...)...)
	}
	got.decodeOnly, got.allOut = d.DecodeOnly, d.AllOut
	got.modelUnlisted, got.loraUnlisted = d.ModelUnlisted, d.LoRAUnlisted
	if byAddress[d.Address] != d.Worker {
		t.Errorf("decision names worker %q at %q", d.Worker, d.Address)
	}
	return got
}

const propCases = 2000

func TestListFilterProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 2026))
	failures := 0
	for i := range propCases {
		c := randomPropCase(rng)
		if !checkPropCase(t, i, c) {
			failures++
			if failures >= 5 {
				t.Fatalf("stopping after %d failing cases", failures)
			}
		}
	}
}

// checkPropCase routes c with and without its lists and reports whether every property
// held.
func checkPropCase(t *testing.T, i int, c propCase) bool {
	t.Helper()
	want := propReference(c)
	got := propRoute(t, c, true)
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	// The reference: outcome, candidates, prefill candidates, flags.
	if got.class != want.class {
		fail("outcome %s, the rules say %s", got.class, want.class)
	}
	if got.class == propOK && want.class == propOK {
		if got.base != want.base || got.lora != want.lora {
			fail("ran as %q/%q, the rules say %q/%q", got.base, got.lora, want.base, want.lora)
		}
		if !slices.Equal(got.dests, want.dests) {
			fail("destinations %q, the rules say %q (step %d)", got.dests, want.dests, want.step)
		}
		if !slices.Equal(got.prefills, want.prefills) {
			fail("prefill candidates %q, the rules say %q", got.prefills, want.prefills)
		}
		switch {
		case !want.prefillFleet && got.decodeOnly != "":
			fail("decode-only %q without a prefill worker for the request", got.decodeOnly)
		case want.prefillFleet && len(want.prefills) == 0 && got.decodeOnly != DecodeOnlyNoPrefillWorker:
			fail("decode-only %q, every allowed prefill worker being out", got.decodeOnly)
		}
		if got.allOut != want.allOut {
			fail("AllOut %v, the rules say %v", got.allOut, want.allOut)
		}
		if got.modelUnlisted != want.modelUnlisted {
			fail("ModelUnlisted %v, the rules say %v (step %d)", got.modelUnlisted, want.modelUnlisted, want.step)
		}
		if got.loraUnlisted != want.loraUnlisted {
			fail("LoRAUnlisted %v, the rules say %v (step %d)", got.loraUnlisted, want.loraUnlisted, want.step)
		}
	}

	if got.class == propOK {
		byName := map[string]Worker{}
		for _, w := range c.workers {
			byName[w.Name] = w
		}
		for _, name := range got.dests {
			w := byName[name]
			// Never a prefill worker; always inside the subset; always a worker configured
			// for the model whose own lora_adapters allow the adapter.
			if w.Role == RolePrefill {
				fail("prefill worker %s is a destination", name)
			}
			if c.subset != nil && !slices.Contains(c.subset, w.Address) {
				fail("destination %s is outside the subset", name)
			}
			if _, ok := want.baseMay[name]; !ok {
				fail("destination %s is not configured for %q", name, got.base)
			}
			if got.lora != "" && len(w.LoRAAdapters) > 0 && !slices.Contains(w.LoRAAdapters, got.lora) {
				fail("destination %s's own lora_adapters %q leave out %q", name, w.LoRAAdapters, got.lora)
			}
			if !got.allOut && c.out[name] {
				fail("destination %s is out for health", name)
			}
			// A list that leaves the candidate out is set aside only by a fallback the
			// decision reports.
			if !want.baseMay[name] && !got.modelUnlisted {
				fail("destination %s's list leaves out %q, and the decision is not marked model_unlisted", name, got.base)
			}
			if !want.adapterMay[name] && len(w.LoRAAdapters) == 0 && !got.loraUnlisted && !got.modelUnlisted {
				fail("destination %s's list leaves out adapter %q, and the decision is not marked lora_unlisted", name, got.lora)
			}
		}
		// Invariant 2: a worker whose known list leaves the model or adapter out is chosen
		// only when no reachable healthy destination has evidence (config, or a list
		// naming it).
		for _, name := range got.dests {
			if want.baseMay[name] && want.adapterMay[name] {
				continue
			}
			for _, w := range c.workers {
				if w.Role == RolePrefill || c.out[w.Name] || (c.subset != nil && !slices.Contains(c.subset, w.Address)) {
					continue
				}
				if _, ok := want.baseMay[w.Name]; !ok {
					continue
				}
				if evidenceFor(c, w, got.base, got.lora) {
					fail("destination %s's list leaves the request out, while %s, reachable and healthy, names it", name, w.Name)
				}
			}
		}
	}

	// Invariant 1: the lists never refuse. A request served without them (same fleet,
	// same resolution) is served with them; one refused without them is refused the
	// same way.
	if c.lists != nil {
		plain := propRoute(t, c, false)
		sameResolution := plain.class != propOK || got.class != propOK || (plain.base == got.base && plain.lora == got.lora)
		if _, declared := adapterBases(propDeclared)[c.model]; declared || !slices.Contains(propAdapters, c.model) {
			if plain.class != got.class {
				fail("outcome %s with the lists, %s without", got.class, plain.class)
			}
			if !sameResolution {
				fail("a declared name resolved differently with the lists")
			}
		}
	}

	if len(bad) > 0 {
		t.Errorf("case %d:\n%s%s\n  want %+v\n  got  %+v", i, c, strings.Join(bad, "\n"), want, got)
		return false
	}
	return true
}

// evidenceFor reports whether w has evidence it serves base (and adapter): its config
// names the model, or its engine's list does; its own lora_adapters or its engine's
// list names the adapter (with the adapter lists in use).
func evidenceFor(c propCase, w Worker, base, adapter string) bool {
	open := len(w.Models) == 0 && w.KVEvents == nil
	ownNames := adapter != "" && slices.Contains(w.LoRAAdapters, adapter) // config: it serves base
	l, known := c.lists[w.Name]
	if open && c.lists != nil {
		if !known && !ownNames {
			return false
		}
		if known && !slices.Contains(l.bases, base) && !slices.Contains(slices.Collect(maps.Values(l.adapters)), base) {
			return false
		}
	}
	switch {
	case adapter == "":
		return true
	case len(w.LoRAAdapters) > 0:
		return slices.Contains(w.LoRAAdapters, adapter)
	case c.lists == nil || c.onDemand:
		return true
	}
	_, named := l.adapters[adapter]
	return known && named
}
