package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// Errors the Envoy-facing edge maps to HTTP statuses.
var (
	// ErrModelNotFound: no configured worker serves the request's model (404).
	ErrModelNotFound = errors.New("router: no worker serves the model")
	// ErrNoWorkers: workers serve the model but none is eligible now (503).
	ErrNoWorkers = errors.New("router: no eligible worker")
	// ErrOnlyPrefillWorkers: the model's workers are all prefill workers, which are never
	// a destination (503; a fleet misconfiguration, not a passing state). It wraps
	// ErrNoWorkers.
	ErrOnlyPrefillWorkers = fmt.Errorf("%w: only prefill workers serve the model, and a request needs a decode worker", ErrNoWorkers)
	// ErrBadRequest: the request cannot be routed as given (400).
	ErrBadRequest = errors.New("router: bad request")
	// ErrOverloaded: every candidate is at max_active_requests_per_worker (429).
	ErrOverloaded = errors.New("router: every worker is at its active-request limit")
	// ErrHolderBusy: the worker holding the most of a request's prompt is at
	// max_active_requests_per_worker while another could take it, and the request
	// asked to wait for it (Request.WaitForHolder). *HolderBusyError wraps it, and it
	// wraps ErrOverloaded.
	ErrHolderBusy = fmt.Errorf("%w: the worker holding the most of the prompt is at its limit", ErrOverloaded)
	// ErrSaturated: the request is sheddable (its objective's priority is below 0) and
	// no candidate has capacity for it (Deps.Saturation) (429).
	ErrSaturated = errors.New("router: the fleet is saturated and the request's objective is sheddable")
)

// HolderBusyError is ErrHolderBusy naming the worker the request waits for.
type HolderBusyError struct {
	// Worker is the full worker holding the most of the prompt.
	Worker string
	// blocks are the refused decision's prompt blocks, for StillWaits; nil in an error
	// Route did not make. req is the request as the decision read it (its adapter
	// resolved), and fitTokens the prompt's exact ids its candidates were fitted to (0:
	// none), for StillWaits to take the candidates a decision would take now
	// (destinationsOf).
	blocks    []uint64
	req       Request
	fitTokens int
}

func (e *HolderBusyError) Error() string {
	return fmt.Sprintf("%v (%s)", ErrHolderBusy, e.Worker)
}

// Unwrap makes a HolderBusyError ErrHolderBusy, and so ErrOverloaded.
func (e *HolderBusyError) Unwrap() error { return ErrHolderBusy }

// BlockIndex is what the router needs of the block index: overlaps and cache
// footprints to score, and recording the chosen worker's blocks (approximate mode).
// *index.Index and *index.EventIndex satisfy it.
type BlockIndex interface {
	Overlaps(hashes []uint64, workers []string, dst []int)
	// Footprints reports each worker's blocks held and capacity in blocks, for every
	// candidate at once: the inputs of the cache-pressure term.
	Footprints(workers []string, held, capacity []int)
	Store(worker string, hashes []uint64) error
	// Clear forgets every block of worker: its address changed, so another engine (with
	// an empty cache) runs under its name (Router.SetWorkers).
	Clear(worker string) error
	// Unrecord forgets blocks Store recorded on worker, for a request another worker
	// served (Decision.Served); blocks an engine reported stay.
	Unrecord(worker string, hashes []uint64) error
}

// OffloadIndex reports, per worker, the run of a prompt's blocks after its device
// overlap that the worker's engine holds in a slower tier (host memory), which it
// would load rather than compute. *index.EventIndex satisfies it; an index without it
// reports none.
type OffloadIndex interface {
	Offloaded(hashes []uint64, workers []string, from, dst []int)
}

// Modes reports where the index's entries for a worker come from (index.ModeEvents or
// index.ModeApproximate), for the decision trace. *index.EventIndex satisfies it.
type Modes interface {
	Mode(worker string) index.Mode
}

// Signals reports what an engine says of itself (DESIGN §5's optional second load
// signal): queued requests and KV cache utilisation in [0,1].
type Signals interface {
	Signals(worker string) (waiting int, kvUtilization float64)
}

// LoRASlots reports how many LoRA adapters a worker's engine runs at once, as the
// engine says (0: unknown), for workers without max_loras. *enginemetrics.Scraper
// satisfies it.
type LoRASlots interface {
	MaxLoRAs(worker string) int
}

// EngineAdapters reports the LoRA adapters a worker's engine says it runs or queues
// requests of (scraped; nil when unknown), which the cost counts as running there with
// the ones this router booked. *enginemetrics.Scraper satisfies it.
type EngineAdapters interface {
	EngineAdapters(worker string) []string
}

// LoRAStates reports what a worker's engine says of a LoRA adapter (running, queued,
// a slot free, full), for the GIE baseline's LoRA-affinity score. Replays provide it
// from the simulated engines.
type LoRAStates interface {
	LoRAState(worker, adapter string) scoring.LoRAState
}

// ModelLists reports what each worker's engine lists as served (its /v1/models): the
// base models it serves and the LoRA adapters it has loaded, and the base model the
// lists give an adapter. *enginemodels.Lister satisfies it.
type ModelLists interface {
	// ServesModel reports whether the worker's engine lists model as a base model it
	// serves, and whether its list is known at all.
	ServesModel(worker, model string) (serves, known bool)
	// ServesAdapter reports whether the worker's engine lists the adapter, and whether
	// its list is known at all.
	ServesAdapter(worker, adapter string) (serves, known bool)
	// BaseOf returns the adapter's base model as the engines list it.
	BaseOf(adapter string) (base string, ok bool)
}

// RecordSink hears the blocks each decision stores in the index on its worker
// (Deps.RecordBlocks), and the request's session id if it has one (the destination's
// record only), to tell the other replicas (*peers.Records). It is called under the
// decision lock: it must not block.
type RecordSink interface {
	// Recorded hears that the decision stored blocks on worker at address.
	Recorded(worker, address string, blocks []uint64, session string)
}

// Sessions remembers the worker that served each session last (session affinity by
// header). *session.Store satisfies it.
type Sessions interface {
	Lookup(id string) (worker string, ok bool)
	Remember(id, worker string)
	// ForgetWorker forgets the sessions last served by worker: another engine now
	// runs under its name, or none does.
	ForgetWorker(worker string) int
}

// StoredResponses remembers which worker stored each Responses API response (its
// engine's in-process response store holds it, and no other engine's does).
// *session.Store satisfies it: the id is hashed, never kept.
type StoredResponses interface {
	// LookupKey and RememberKey read and write the worker kept under a key: a response
	// id's (KeyOf) or an SGLang session id's (SGLangSessionKeyOf), which the other
	// replicas are told.
	LookupKey(key uint64) (worker string, ok bool)
	RememberKey(key uint64, worker string)
	// KeyOf and SGLangSessionKeyOf are the keys of a response id and of an SGLang
	// session id: two families, so that no id of one kind, however chosen, finds the
	// other kind's entry.
	KeyOf(id string) uint64
	SGLangSessionKeyOf(id string) uint64
	// ForgetWorker forgets the responses worker stored: another engine now runs under
	// its name (an empty store), or it left the fleet.
	ForgetWorker(worker string) int
}

// ResponseSink hears each response a decision's worker stored and each SGLang session
// it opened (Deps.Responses), by its key (StoredResponses.KeyOf, SGLangSessionKeyOf)
// and the worker's address: peers.Records tells the
// other replicas.
type ResponseSink interface {
	RecordedResponse(worker, address string, key uint64)
}

// Eligibility says whether a worker may be chosen now (DESIGN §7: a failing worker is
// out for a back-off). *health.Tracker satisfies it.
type Eligibility interface {
	Eligible(worker string) bool
}

// Tokenizers gives each model's prompt encoder: its tokenizer and chat template, or its
// engine's render endpoint. The prompt is encoded once per request, by the model's
// encoder, whatever worker is chosen. *models.Set (tokenize/models) satisfies it.
type Tokenizers interface {
	Model(name string) tokenize.PromptEncoder
}

// Deps are the collaborators a Router is built from.
type Deps struct {
	// Tokenizers gives each model's prompt encoder. When nil, every model's prompts go
	// through Tokenizer and Renderer (replays and tests with one file-free pair).
	Tokenizers Tokenizers
	Tokenizer  tokenize.Tokenizer
	Renderer   tokenize.ChatRenderer
	Index      BlockIndex
	Bookings   *scoring.Bookings
	Picker     scoring.Picker
	// PrefillPicker, when set, picks prefill workers (disaggregated prefill/decode);
	// nil uses Picker. A picker with state across decisions (round_robin) needs its own
	// instance here: sharing one, every decision advances its rotation twice, and with
	// an even count of workers the destination and the prefill worker never change.
	PrefillPicker scoring.Picker
	// RecordBlocks stores the chosen worker's blocks in the index after each decision:
	// the approximate index's whole knowledge, or an [index.EventIndex]'s pending blocks
	// until the engine reports them. Off only for an index that must hold nothing but
	// what engines report.
	RecordBlocks bool
	// Records, when set, hears every block record RecordBlocks makes.
	Records RecordSink
	// Now is the clock for stage timings; nil means time.Now.
	Now func() time.Time
	// Signals, when set, fills each candidate's engine-reported load.
	Signals Signals
	// LoRASlots, when set, gives the adapter slots of workers configured without
	// max_loras.
	LoRASlots LoRASlots
	// LoRAStates, when set, fills each candidate's EngineLoRA for an adapter request.
	LoRAStates LoRAStates
	// EngineAdapters, when set, fills each candidate's EngineAdapters for an adapter
	// request.
	EngineAdapters EngineAdapters
	// ContextLengths, when set, gives the context of workers configured without
	// max_model_len, so a prompt goes only where it fits (Decision.ContextNarrowed,
	// ContextExceeded).
	ContextLengths ContextLengths
	// ModelLists, when set, says which base models the engines of workers configured
	// without models serve, which workers' engines have loaded each LoRA adapter
	// (workers without lora_adapters of their own), and names adapters lora_adapters
	// does not declare. The lists narrow the candidates, never refuse a request.
	ModelLists ModelLists
	// Health, when set, leaves out workers that are out for a health back-off. When
	// every candidate is out, the router routes among all of them rather than refuse
	// (as Envoy's panic threshold does): a health check that is wrong for every worker
	// must not take the whole fleet down.
	Health Eligibility
	// Sessions, when set, marks the candidate that served a request's session last (the
	// cost credits it) and remembers each decision's worker for its session.
	Sessions Sessions
	// Responses, when set, sends a request naming a stored response
	// (Request.PreviousResponseID) to the worker that stored it, and remembers the
	// responses each decision's worker stores (Decision.RememberResponse).
	Responses StoredResponses
	// ResponseRecords, when set with Responses, hears each response remembered.
	ResponseRecords ResponseSink
	// Metrics counts requests routed by load because their prompt could not be
	// encoded; nil counts nothing.
	Metrics *Metrics
	// Policy, when set, gives the disaggregate_tokens (read only in fleets with prefill
	// workers) and the prefill_history_half_life (which decays the bookings' prefill
	// history) in force for requests without their own Params (runtime policy updates
	// apply); nil takes scoring.DefaultParams'. Give it the picker's policy.
	Policy *scoring.Policy
	// Objectives, when set, gives each request the priority of the objective it names
	// (Request.Objective); nil gives every request priority 0, and none is sheddable.
	Objectives Objectives
	// Saturation is the rule a sheddable request (priority below 0) is admitted by: its
	// candidates are the workers with capacity, and with none it is refused with
	// ErrSaturated. Requests of priority 0 or more are never refused for saturation.
	Saturation priority.Saturation
	// EngineLoad gives the engines' own reports of their queues and KV use, which
	// Saturation reads; nil knows none, so no candidate has capacity for a sheddable
	// request.
	EngineLoad EngineLoad
}

// Router makes routing decisions. Build it with [New].
type Router struct {
	blockSize int
	maxActive int               // 0: never shed
	adapters  map[string]string // LoRA adapter → base model; fixed at New
	loras     []LoRAAdapter     // the config's lora_adapters, to validate later worker sets
	// loraOnDemand: the engines load any adapter on its first request (lora_on_demand).
	loraOnDemand bool
	deps         Deps
	prompter     Prompter
	offload      OffloadIndex // deps.Index's offloaded runs; nil when it keeps none
	modes        Modes        // deps.Index's per-worker modes, for the trace; nil when it has none

	workersMu sync.RWMutex
	workers   []Worker
	// addresses maps each worker's name to its address. Set with workers, under both
	// workersMu and decideMu, so a decision reads it under decideMu alone.
	addresses map[string]string
	// anyOpen: some worker is configured without models (Worker.open), so the engines'
	// lists of base models narrow where a model goes. Set with workers.
	anyOpen bool

	// decideMu serialises lookup → pick → book → record, so each decision sees the
	// overlaps, footprints, load and blocks of the previous one (DESIGN §2 step 7), and
	// orders decisions against SetWorkers: a worker that moves is cleared between two
	// decisions, never while one records.
	decideMu sync.Mutex

	// scratches pools the buffers (*scratch) of finished decisions.
	scratches sync.Pool
}

// scratch holds one decision's buffers, none of which outlives Route: a decision
// returns only what it copied out of them (the chosen and fallback addresses, the block
// hashes) and the picker's own terms, and pickers do not retain their candidates.
// Reusing them keeps a decision's garbage to what it returns.
type scratch struct {
	prompt     tokenize.Buffers // the rendered prompt and its ids
	candidates []Worker
	names      []string
	scored     []scoring.Candidate
	ints       []int
	out        []Worker  // the destinations left out for a health back-off
	may        []bool    // which workers the engines' lists leave to a request
	verdicts   []verdict // what the config and the lists say of each worker
	prefill    prefillScratch
	params     scoring.Params // the policy in force for the decision, read once
}

// maxPooledCandidates and maxPooledPromptBytes bound the buffers a pooled scratch
// keeps, so one decision over an unusually large fleet or prompt does not pin its
// buffers for every later one: a larger one allocates anew. 256 KiB of text (and as
// many ids) covers a 64k-token prompt.
const (
	maxPooledCandidates  = 4096
	maxPooledPromptBytes = 256 << 10
)

func (r *Router) getScratch() *scratch {
	if sc, ok := r.scratches.Get().(*scratch); ok {
		return sc
	}
	return new(scratch)
}

func (r *Router) putScratch(sc *scratch) {
	if cap(sc.candidates) > maxPooledCandidates || cap(sc.out) > maxPooledCandidates || cap(sc.scored) > maxPooledCandidates || cap(sc.prefill.scored) > maxPooledCandidates || cap(sc.may) > maxPooledCandidates || cap(sc.verdicts) > maxPooledCandidates {
		return
	}
	if cap(sc.prompt.Text) > maxPooledPromptBytes {
		sc.prompt.Text = nil
	}
	if cap(sc.prompt.IDs) > maxPooledPromptBytes {
		sc.prompt.IDs = nil
	}
	// A pooled scratch keeps workers' names and addresses reachable, which the fleet's
	// config holds anyway, and the last prompt's text, as the tokenizer's memo does: it
	// is not cleared.
	r.scratches.Put(sc)
}

// New returns a Router over the configured workers.
func New(cfg Config, deps Deps) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Tokenizers == nil && (deps.Tokenizer == nil || deps.Renderer == nil) {
		return nil, errors.New("router: Tokenizers, or Tokenizer and Renderer, are required")
	}
	if deps.Index == nil || deps.Bookings == nil || deps.Picker == nil {
		return nil, errors.New("router: Index, Bookings and Picker are required")
	}
	if deps.Tokenizers == nil {
		deps.Tokenizers = OneTokenizer(tokenize.Pipeline{Tokenizer: deps.Tokenizer, Renderer: deps.Renderer})
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	offload, _ := deps.Index.(OffloadIndex)
	modes, _ := deps.Index.(Modes)
	return &Router{offload: offload, modes: modes, anyOpen: slices.ContainsFunc(cfg.Workers, Worker.open), blockSize: cfg.BlockSize, maxActive: cfg.MaxActiveRequestsPerWorker, adapters: adapterBases(cfg.LoRAAdapters), loras: slices.Clone(cfg.LoRAAdapters), loraOnDemand: cfg.LoRAOnDemand, deps: deps, workers: slices.Clone(cfg.Workers), addresses: addressesOf(cfg.Workers),
		prompter: Prompter{BlockSize: cfg.BlockSize, Tokenizers: deps.Tokenizers, Metrics: deps.Metrics}}, nil
}

// Workers returns the workers decisions are made among, in configured order.
func (r *Router) Workers() []Worker {
	r.workersMu.RLock()
	defer r.workersMu.RUnlock()
	return slices.Clone(r.workers)
}

// SetWorkers replaces the fleet (a config reload). The list is validated like the
// config's; on error nothing changes. Decisions under way finish with the old list; the
// index and the health tracker must already know every new worker, since the next
// decision may record blocks on it.
//
// A worker whose address changes is another engine under the same name, with an empty
// cache: its index entries are cleared here, between two decisions, and a decision that
// chose it at its old address (its candidates were read before the change) records
// nothing on it. Cleared by the caller instead, a decision recording just after the
// clear credited the new engine with the old one's blocks. The ledger starts it anew
// (the old engine's running requests and resident adapters are not the new one's), and
// the sessions it served last are forgotten, as are those of a worker that left.
func (r *Router) SetWorkers(workers []Worker) error {
	if err := r.ValidateWorkers(workers); err != nil {
		return err
	}
	moved, gone, err := r.setWorkers(workers)
	if err != nil {
		return err
	}
	// After the decision lock: a store of millions of sessions takes a while to read,
	// and a decision meanwhile may credit the old engine once (a bias, not a record).
	for _, name := range append(moved, gone...) {
		if r.deps.Sessions != nil {
			r.deps.Sessions.ForgetWorker(name)
		}
		if r.deps.Responses != nil {
			r.deps.Responses.ForgetWorker(name)
		}
	}
	return nil
}

// setWorkers is SetWorkers' part under the decision lock. It returns the workers whose
// address changed and those no longer in the fleet.
func (r *Router) setWorkers(workers []Worker) (moved, gone []string, err error) {
	r.decideMu.Lock()
	defer r.decideMu.Unlock()
	r.workersMu.Lock()
	defer r.workersMu.Unlock()
	next := addressesOf(workers)
	for name, old := range r.addresses {
		switch address, ok := next[name]; {
		case !ok:
			gone = append(gone, name)
		case address != old:
			moved = append(moved, name)
		}
	}
	r.workers = slices.Clone(workers)
	r.addresses = next
	r.anyOpen = slices.ContainsFunc(r.workers, Worker.open)
	for _, name := range moved {
		r.deps.Bookings.DetachWorker(name)
		if err := r.deps.Index.Clear(name); err != nil && !errors.Is(err, index.ErrUnknownWorker) {
			return nil, nil, fmt.Errorf("router: clear the moved worker %q: %w", name, err)
		}
	}
	return moved, gone, nil
}

// addressesOf maps workers' names to their addresses.
func addressesOf(workers []Worker) map[string]string {
	out := make(map[string]string, len(workers))
	for _, w := range workers {
		out[w.Name] = w.Address
	}
	return out
}

// ValidateWorkers reports whether workers could be this router's: valid, and listing
// none of its LoRA adapters as a model (a worker serving the base serves them).
func (r *Router) ValidateWorkers(workers []Worker) error {
	return Config{BlockSize: r.blockSize, Workers: workers, LoRAAdapters: r.loras}.Validate()
}

// Request is a protocol-free routing request.
type Request struct {
	// Model is the requested model; it restricts the candidates and salts block hashes.
	Model string
	// AnyModel makes every worker a candidate whatever Model says: load-only routing of
	// requests whose body (and so model) kvroute cannot read.
	AnyModel bool
	// LoRA and CacheSalt, when set, put the prompt's blocks in their own namespace. A
	// Model that names one of the config's lora_adapters is taken as LoRA on its base
	// model, as an engine takes it; setting LoRA yourself makes Model the base (but
	// with BaseOnly).
	LoRA, CacheSalt string
	// Whole says the request's API is one the decode workers' routing sidecar passes
	// on whole (SGLang's /generate: llm-d's sidecar splits the OpenAI APIs and vLLM's
	// generate): in a fleet with prefill workers the destination prefills it
	// (Decision.DecodeOnly DecodeOnlyWholeAPI), and no prefill worker is booked.
	Whole bool
	// BaseOnly says Model was not named by the body (it came from the model header or
	// default_model), so the engine runs no adapter for it: vLLM's generate API gives
	// a body without model none (_maybe_get_adapters). A Model naming a LoRA adapter is
	// then routed for the adapter's base model, in the base's block namespace, or in
	// LoRA's when set (an SGLang body's lora_path, the adapter it names apart).
	BaseOnly bool
	// Exactly one way to give the prompt: Tokens (already tokenized, e.g. a completions
	// prompt of token ids or a replay), Chat (rendered by the model's template, then
	// encoded without special tokens: the template writes them) or Prompt (completions
	// text, encoded with the tokenizer's special tokens, as engines do).
	Tokens []uint32
	Chat   *tokenize.Chat
	Prompt string
	// Rebuilt marks a Chat kvroute rebuilt from another API's body (a Responses or an
	// Anthropic Messages API request, as vLLM converts it): routed on its blocks, but its ids are not
	// trusted to be the engine's to the token (no engine is left out for its context),
	// and a template's refusal of it is a fallback to load, not the client's error.
	Rebuilt bool
	// Body is the request body Chat or Prompt was read from, for a model whose engine
	// renders its prompts (the body is sent as is); nil otherwise.
	Body []byte
	// BodyAPI is the API Body is written for (tokenize.Prompt.BodyAPI): the render
	// endpoint an engine-rendered model's body goes to. Zero is chat completions when
	// Chat is set, else completions; a Rebuilt Chat's body says Responses or Messages.
	BodyAPI tokenize.API
	// AddSpecialTokens, when set, is the request's add_special_tokens (see
	// tokenize.Prompt); nil is the endpoint's default.
	AddSpecialTokens *bool
	// TruncatePromptTokens, when set, is the request's truncate_prompt_tokens (vLLM):
	// the engine keeps that many of the prompt's tokens (-1: its max_model_len).
	TruncatePromptTokens *int64
	// Unsupported, when set, is why the prompt the engine serves cannot be computed in
	// process although the engine may serve the request (openai.Request.Unsupported: a
	// completions request's prompt_embeds or suffix): the request is routed by load
	// alone, a FallbackUnsupported, whatever it gives as its prompt.
	Unsupported error
	// Sequences, when above 1, is how many sequences the engine runs for the request
	// (openai.Request.Sequences: its parallel samples, its batch's prompts): each
	// takes a batch slot, so each counts in N(w), and in W(w) until the first token;
	// the prompt's blocks and prefill count once. A prefill worker's leg is one.
	Sequences int
	// MaxTokens, when not 0, is the request's bound on its output tokens (a chat's
	// max_completion_tokens, else its max_tokens; openai.Request.MaxTokens): vLLM
	// refuses a prompt whose tokens plus it pass the engine's context, so the request
	// goes, when it can, where both fit.
	MaxTokens int64
	// Params, when not nil, overrides the policy's cost parameters for this request.
	Params *scoring.Params
	// Override, when not nil and Params is, gives this request's cost parameters from
	// those in force at its decision (Deps.Policy's, else scoring.DefaultParams'): a
	// per-route override of some keys, applied on top of the policy each time the
	// request is decided, so that one held by flow control while the policy changed
	// (PUT /policy, a reload) is priced with the new policy's other keys.
	Override func(base scoring.Params) scoring.Params
	// Subset, when not nil, restricts the candidates to these worker addresses (the GIE
	// endpoint subset hint); an entry that is an IP alone admits every worker at that IP.
	Subset []string
	// Session, when not empty, names the request's session (the session header's value).
	Session string
	// PreviousResponseID, when not empty, names a stored Responses API response the
	// request needs: the previous_response_id of a POST /v1/responses, or the id of a
	// GET, cancel or delete of one. When Deps.Responses knows the worker that stored
	// it, that worker is the only candidate, healthy or not: vLLM keeps responses in
	// each engine's own memory, and every other engine answers 404.
	PreviousResponseID string
	// SGLangSession, when not empty, names the SGLang session the request continues or
	// closes: a /generate body's session_params.id, a /close_session body's session_id.
	// SGLang keeps a session in the memory of the engine that opened it, and every other
	// engine aborts the request ("session id … does not exist"): when Deps.Responses
	// knows that engine's worker (Decision.RememberSGLangSession), it is the only
	// candidate, healthy or not, as for PreviousResponseID.
	SGLangSession string
	// OpensSGLangSession: the request opens the SGLang session SGLangSession names (an
	// /open_session choosing its id). It goes to the worker whose engine holds an open
	// session of that id, which refuses it as one SGLang refuses a second open; when
	// none does, it is routed as any other, and not counted (Decision.SGLangSession "").
	OpensSGLangSession bool
	// Objective, when not empty, names the request's Gateway API Inference Extension
	// objective (the objective header's value), whose priority Deps.Objectives gives.
	Objective string
	// Rewrite, when not empty, names the model rewrite (model_rewrites, or an
	// InferenceModelRewrite) that chose Model for this request; RewriteHeader, when
	// not empty, names the request header that did (the model-name rewrite header);
	// with either, RequestedModel is the model the client's body asked for. The caller
	// rewrites; the router routes on Model.
	Rewrite, RewriteHeader, RequestedModel string
	// FairnessID, when not empty, names the request's flow for flow control (the
	// fairness header's value): the flows of one priority take turns. The router does
	// not read it.
	FairnessID string
	// WaitForHolder: when a worker at max_active_requests_per_worker holds more than
	// half of the prompt's blocks beyond what every other candidate holds, full or free,
	// and beyond a hot shared prefix (holderOf), refuse with a *HolderBusyError naming
	// it rather than route the request elsewhere: flow control holds it a while for
	// that worker (flow_control.holder_wait).
	WaitForHolder bool
	// Held: flow control holds the request when the router refuses it for capacity
	// (ErrOverloaded, ErrSaturated), so such a refusal is not yet an answer, and the
	// router does not count it as a shed request (flow control counts its outcomes).
	Held bool
	// HoldOnSaturation (flow_control.hold_on_saturation): a request of any priority is
	// refused with ErrSaturated while every candidate is saturated by the Saturation
	// rule, for flow control to hold, rather than sent to an engine's queue. Unlike a
	// sheddable request's, its candidates are not narrowed (with one of them not
	// saturated it is routed as without), and a worker whose engine kvroute has no
	// fresh reading of does not count as saturated: a scrape that fails holds nothing.
	HoldOnSaturation bool
	// OnHeld, when set, is called once, on the goroutine that routes the request, when
	// flow control holds it (before it waits): the filter then asks Envoy to lengthen
	// the request's message timer (flow_control.override_message_timeout). The router
	// never calls it.
	OnHeld func()
}

// Timings are the durations of a decision's stages, for the latency histogram. Lookup
// includes waiting for the decision lock (held by concurrent decisions).
type Timings struct {
	Tokenize, Hash, Lookup, Score time.Duration
}

// Decision is a routing decision and the booking it holds on the chosen worker.
type Decision struct {
	scoring.Decision
	// Address is the chosen worker's ip:port.
	Address string
	// FallbackAddresses are the other candidates' addresses, best first.
	FallbackAddresses []string
	// Model is the model the request ran on: its base model when it named a LoRA
	// adapter, which LoRA then names.
	Model, LoRA string
	// PromptTokens is the prompt length in tokens; Blocks the number of full blocks.
	PromptTokens, Blocks int
	// PromptEstimatedTokens, when not 0, is the part of PromptTokens estimated from
	// the bytes of a prompt text whose encoding stopped early (max_prompt_tokens, or
	// the tokenizer's bound on long words): the request was routed on the full blocks
	// of its first ids.
	PromptEstimatedTokens int
	// PredictedCachedTokens is the chosen worker's overlap in tokens.
	PredictedCachedTokens int
	// AllOut is set when every candidate was out for a health back-off, so the decision
	// ignored health; or every one the prompt fits (the eligible ones' engines refuse
	// it: ContextNarrowed).
	AllOut bool
	// Prefill, when not nil, is the prefill worker of a disaggregated request: it
	// computes the prompt and sends its KV to the destination (the decode worker).
	Prefill *Prefill
	// DecodeOnly, in a fleet with prefill workers serving the model, says why the
	// destination prefills the request itself (DecodeOnlyUnderThreshold,
	// DecodeOnlyNoPrefillWorker or DecodeOnlyWholeAPI); "" when Prefill is set or the
	// fleet has none.
	DecodeOnly string
	// MissingTokens, in a fleet with prefill workers serving the model, is how many
	// prompt tokens the destination does not hold: what decides the split.
	MissingTokens int
	// LoRAUnlisted is set for an adapter request that no destination of its base model
	// names (in its own lora_adapters or its engine's model list): it went to every
	// worker of the base model without lora_adapters of its own, whose engines may
	// load it on demand.
	LoRAUnlisted bool
	// ModelUnlisted is set for a request whose model (an adapter's base model) no
	// destination serves by config or by its engine's model list: it went to every
	// worker configured to serve it, as if there were no model lists.
	ModelUnlisted bool
	// PromptFallback, when set, names why the prompt could not be encoded (one of the
	// Fallback* reasons): the request was routed by load alone, as an empty prompt.
	PromptFallback string
	// ContextNarrowed is set when candidates were left out because the prompt's ids
	// (with the request's MaxTokens) reach their engines' context (max_model_len): the
	// request went where it fits.
	ContextNarrowed bool
	// ContextExceeded is set when the prompt's ids reach every candidate's context: the
	// chosen engine refuses it (a 400), so the decision routed it by load, as a request
	// without a prompt, booked no prefill, no active blocks and no LoRA adapter, and
	// recorded no blocks or session for it.
	ContextExceeded bool
	// Objective is the objective the request named (Request.Objective), and Priority
	// its priority (0 for an objective no source defines).
	Objective string
	Priority  int
	// Rewrite, RewriteHeader and RequestedModel are the request's (Request.Rewrite): the
	// rewrite or the header that chose Model, and the model the client asked for.
	Rewrite, RewriteHeader, RequestedModel string
	// StoredResponse says how a request naming a stored response
	// (Request.PreviousResponseID) was routed: one of the StoredResponse* values; ""
	// for a request that names none (or a router without Deps.Responses).
	StoredResponse string
	// SGLangSession says, with the same values, how a request naming an SGLang session
	// (Request.SGLangSession) was routed; "" for one that names none.
	SGLangSession string
	Timings       Timings

	booking *scoring.Booking
	modes   Modes
	// router, blocks and session are what Served needs to move the request.
	router  *Router
	blocks  []uint64
	session string
	// served names the worker that served the request when a fallback did (Served),
	// and servedAddress its address.
	served, servedAddress string
	// refused is set once Refused has forgotten the blocks.
	refused bool
}

// IndexMode names where the index's entries for a candidate came from when asked:
// "events" or "approximate" ("" when the index does not say). Read for the decision
// trace only, so decisions do not pay for it.
func (d *Decision) IndexMode(worker string) string {
	if d.modes == nil {
		return ""
	}
	return d.modes.Mode(worker).String()
}

// FirstToken ends the request's share of the worker's pending prefill, and frees its
// prefill worker's booking: the destination's first token comes after the prefill
// worker's KV arrived. Idempotent.
func (d *Decision) FirstToken() {
	if d.booking != nil {
		d.booking.PrefillDone()
	}
	if d.Prefill != nil && d.Prefill.booking != nil {
		d.Prefill.booking.Release()
	}
}

// PrefillerDone frees the prefill worker's booking of a disaggregated request: the
// destination's response has begun, which its routing sidecar starts only once the
// prefill worker answered (a non-streamed response has no first token before its end).
// Idempotent; nothing for a request without a prefill worker.
func (d *Decision) PrefillerDone() {
	if d.Prefill != nil && d.Prefill.booking != nil {
		d.Prefill.booking.Release()
	}
}

// Release frees the request's bookings (the destination's and its prefill worker's) at
// completion, cancel or error. Only the first call releases; it reports whether this
// call did.
func (d *Decision) Release() bool {
	if d.Prefill != nil && d.Prefill.booking != nil {
		d.Prefill.booking.Release()
	}
	return d.booking != nil && d.booking.Release()
}

// ServedWorker names the worker that serves the request: the chosen one, or the
// fallback [Decision.Served] moved it to.
func (d *Decision) ServedWorker() string {
	if d.served != "" {
		return d.served
	}
	return d.Worker
}

// Served moves the request to the fallback at address when the data plane reports that
// the fallback served it (GIE's x-gateway-destination-endpoint-served: the chosen
// worker could not take the request). What the decision put on the chosen worker
// follows the request: its booking (with the fallback's own uncached prompt tokens as
// its prefill share, capped at the fallback's context), the blocks it recorded there
// beyond what the chosen worker already held (forgotten there, recorded on the
// fallback), and its session. A decision whose prompt passes every candidate's context
// (ContextExceeded) put none of these there, and the fallback refuses the prompt too:
// only its booking moves, with no prefill. It returns
// the fallback's worker name and true when the request moved. An address that is not
// one of the decision's fallbacks (FallbackAddresses: every other candidate, however
// many of them the data plane was sent) moves nothing; nor does a second call.
//
// The forgotten blocks may have been routed to the chosen worker again meanwhile, and
// computed there: the index then under-reports that worker until its engine's next
// report or the request after, which costs a cache hit, never a wrong placement of
// blocks nobody computed. The other replicas (peers) hear of the fallback's blocks, not
// of the forgetting.
func (d *Decision) Served(address string) (worker string, moved bool, err error) {
	if d.router == nil || d.served != "" || d.booking == nil {
		return "", false, nil
	}
	at := slices.Index(d.FallbackAddresses, address)
	if at < 0 {
		return "", false, nil
	}
	r, fallback, chosen := d.router, d.Terms[d.Fallbacks[at]], d.Terms[d.Chosen]
	prefill := 0
	if d.Prefill == nil && !d.ContextExceeded {
		// Capped at the fallback's context, as Route caps the chosen worker's.
		prefill = computedTokens(d.PromptTokens, fallback, r.blockSize)
		if w, ok := r.worker(fallback.Worker); ok {
			prefill = r.capToContext(prefill, w, d.Model)
		}
	}
	r.decideMu.Lock()
	defer r.decideMu.Unlock()
	if !d.booking.MoveTo(fallback.Worker, prefill) {
		return "", false, nil // released already: the request is over
	}
	d.served, d.servedAddress = fallback.Worker, address
	if err := r.forgetRecorded(chosen.Worker, d.Address, chosen.Overlap, d.blocks); err != nil {
		return fallback.Worker, true, err
	}
	if d.session != "" && r.deps.Sessions != nil {
		r.deps.Sessions.Remember(d.session, fallback.Worker)
	}
	return fallback.Worker, true, r.record(fallback.Worker, address, d.blocks, d.session)
}

// worker returns the fleet's worker named name.
func (r *Router) worker(name string) (Worker, bool) {
	r.workersMu.RLock()
	defer r.workersMu.RUnlock()
	at := slices.IndexFunc(r.workers, func(w Worker) bool { return w.Name == name })
	if at < 0 {
		return Worker{}, false
	}
	return r.workers[at], true
}

// Refused forgets the blocks the decision recorded on the worker that got the request
// (the chosen one, or the fallback Served moved it to) beyond what that worker already
// held, when the response says the engine did not serve it: a 4xx or 5xx status at the
// response headers (a prompt past the model's context, a model or adapter it does not
// have, a busy or failing engine). Left recorded, such blocks credited the worker with
// a prompt it never computed: a hostile 1 M-token prompt's 65,536 blocks filled an
// approximate index's capacity and evicted what the worker really held. A split
// request (Prefill set) forgets nothing, its status may be either worker's; nor does a
// second call. As for Served, blocks routed to the worker again meanwhile and computed
// there are under-reported until the next report or request, and the other replicas
// (peers) do not hear of the forgetting.
func (d *Decision) Refused() error {
	if d.router == nil || d.refused || d.Prefill != nil {
		return nil
	}
	d.refused = true
	term, address := d.Terms[d.Chosen], d.Address
	if at := slices.IndexFunc(d.Fallbacks, func(f int) bool { return d.Terms[f].Worker == d.served }); d.served != "" && at >= 0 {
		term, address = d.Terms[d.Fallbacks[at]], d.FallbackAddresses[at]
	}
	d.router.decideMu.Lock()
	defer d.router.decideMu.Unlock()
	return d.router.forgetRecorded(term.Worker, address, term.Overlap, d.blocks)
}

// forgetRecorded forgets the blocks a decision recorded on worker at address, those
// past the overlap it held before. A worker at another address since (moved or
// removed: its index was cleared) holds nothing of them, and neither does one the index
// no longer knows (a reload removed it). Called under decideMu.
func (r *Router) forgetRecorded(worker, address string, overlap int, blocks []uint64) error {
	if !r.deps.RecordBlocks || overlap >= len(blocks) || r.addresses[worker] != address {
		return nil
	}
	if err := r.deps.Index.Unrecord(worker, blocks[overlap:]); err != nil && !errors.Is(err, index.ErrUnknownWorker) {
		return fmt.Errorf("router: forget the blocks on %s: %w", worker, err)
	}
	return nil
}

// StoreRecord stores another replica's decision's blocks on worker (peers.share_blocks),
// made when the worker was at address ("" from a replica that does not say), as this
// replica's own decisions store theirs: under the decision lock, so that a worker that
// moved (a pod restarted at a new address under its name) is cleared either before the
// record, which then names its old address and is not stored (moved), or after it. A
// worker this replica does not know is the index's error.
func (r *Router) StoreRecord(worker, address string, blocks []uint64) (moved bool, err error) {
	r.decideMu.Lock()
	defer r.decideMu.Unlock()
	if current, ok := r.addresses[worker]; ok && address != "" && current != address {
		return true, nil
	}
	return false, r.deps.Index.Store(worker, blocks)
}

// Route decides where a request goes and books it there. On success the caller owns
// the returned decision's booking and must [Decision.Release] it exactly once.
func (r *Router) Route(ctx context.Context, req *Request) (*Decision, error) {
	req = r.resolveAdapter(req)
	// A model no worker serves is refused before its prompt costs anything.
	if err := r.checkServed(req); err != nil {
		return nil, err
	}
	sc := r.getScratch()
	defer r.putScratch(sc)
	start := r.deps.Now()
	// The prompt's text and ids live in the scratch: only its block hashes, computed
	// from them below, outlive this call (the booking keeps them).
	prompt, err := r.prompter.tokens(ctx, req, &sc.prompt)
	if err != nil {
		return nil, err
	}
	tokens := prompt.Tokens
	// isl is the prompt's length: its ids, and an estimate of what its encoder left out.
	isl := len(tokens) + prompt.EstimatedTokens
	tokenized := r.deps.Now()
	blocks := r.prompter.blocks(req, tokens)
	hashed := r.deps.Now()
	// A prompt whose exact ids reach a worker's context is refused there: it goes where
	// it fits, and where it fits nowhere it books and records nothing (the engine
	// computes none of it). Approximate ids (tokenize.Approx) say nothing certain, and a
	// request with truncate_prompt_tokens -1 is cut to each engine's context and served
	// there (vLLM), so no engine refuses it for its length.
	fitTokens := 0
	if prompt.Fallback == "" && !prompt.Approximate && !req.Rebuilt && len(tokens) > 0 && !truncatesToContext(req) {
		fitTokens = len(tokens)
	}
	// Taken after the prompt, which an engine render may take long to give: the workers
	// and their health are those of now (the lookup stage's time includes it).
	dest, err := r.destinationsOf(req, sc, fitTokens)
	if err != nil {
		return nil, err
	}
	candidates, allOut, prefillFleet := dest.candidates, dest.allOut, dest.prefillFleet
	unlisted, storedResponse, sglangSession, fit := dest.unlisted, dest.storedResponse, dest.sglangSession, dest.fit
	// promptTokens and promptBlocks are what the decision reports of the prompt.
	promptTokens, promptBlocks, session := isl, len(blocks), req.Session
	if fit.exceeded {
		// Whichever engine gets the prompt refuses it before computing or caching any of
		// it: the request is routed as one without a prompt (by load), and puts nothing
		// on its worker but its count. No prefill, no active blocks (D) that would make
		// the worker look full, no blocks recorded, no session moved, nothing for a
		// fallback or a refusal to move or forget.
		blocks, isl, session = nil, 0, ""
	}

	names := slices.Grow(sc.names[:0], len(candidates))[:len(candidates)]
	sc.names = names
	for i, c := range candidates {
		names[i] = c.Name
	}
	scored := slices.Grow(sc.scored[:0], len(candidates))[:len(candidates)]
	sc.scored = scored
	clear(scored) // a pooled scratch holds the last decision's candidates
	for i, c := range candidates {
		r.describe(&scored[i], c, req.LoRA)
	}
	sreq := &scoring.Request{PromptTokens: isl, BlockSize: r.blockSize, Blocks: blocks, Params: req.Params}
	requestPriority := r.priorityOf(req)
	if sreq.Params == nil && (r.deps.Policy != nil || req.Override != nil) {
		// The policy is read once per decision: the destination's price, the split, the
		// prefill worker's price and the bookings' half-life all use this copy, so a
		// runtime update (PUT /policy) landing mid-decision applies from the next one.
		// A route's override applies on top of it.
		if r.deps.Policy != nil {
			sc.params = r.deps.Policy.Params()
		} else {
			sc.params = scoring.DefaultParams()
		}
		if req.Override != nil {
			sc.params = req.Override(sc.params)
		}
		sreq.Params = &sc.params
	}

	// A stream Envoy gave up on while its prompt was encoded (its message_timeout passed)
	// gets no decision: one made would record a prompt that no worker is sent, crediting
	// the chosen worker's cache, the session and the peers' indexes with it.
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// The index is read under the decision lock: a concurrent decision's recorded blocks
	// are then either all seen or not yet made, so two requests of one new prefix cannot
	// both score it as absent everywhere (docs/BENCHMARKS.md has what the lock costs).
	r.decideMu.Lock()
	// One exit for the lock and for a decision that did not complete: an error below,
	// or a collaborator's panic (server.Recovery then fails that stream alone). Its
	// bookings are released and the lock freed, so the router keeps deciding.
	var booking *scoring.Booking
	var split split
	var recorded [2]recordedBlocks // the destination's, the prefill worker's
	records := 0
	done := false
	defer func() {
		if !done {
			if booking != nil {
				r.undo(booking, split.prefill, recorded[:records])
			}
			r.decideMu.Unlock()
		}
	}()
	r.lookUp(&sc.ints, blocks, names, scored)
	last, hasSession := "", false
	if session != "" && r.deps.Sessions != nil {
		last, hasSession = r.deps.Sessions.Lookup(session)
	}
	for i := range scored {
		scored[i].SessionWorker = hasSession && scored[i].Worker == last
	}
	looked := r.deps.Now()
	r.deps.Bookings.Fill(scored, blocks, req.LoRA)
	if r.maxActive > 0 {
		// Flow control holds a request a while for its busy holder (holderOf): the
		// refusal keeps the blocks and the request, for StillWaits. Otherwise, shed: full
		// workers are not candidates; with none left, refuse (429).
		if req.WaitForHolder {
			if holder := holderOf(scored, r.maxActive, len(blocks)); holder != "" {
				return nil, &HolderBusyError{Worker: holder, blocks: blocks, req: *req, fitTokens: fitTokens}
			}
		}
		kept := 0
		for i := range scored {
			if scored[i].ActiveRequests < r.maxActive {
				scored[kept], candidates[kept] = scored[i], candidates[i]
				kept++
			}
		}
		if kept == 0 {
			return nil, ErrOverloaded
		}
		scored, candidates = scored[:kept], candidates[:kept]
	}
	if priority.Sheddable(requestPriority) {
		// Shed by priority (GIE's InferenceObjective): a sheddable request goes only to a
		// candidate with capacity, and with none left the fleet is saturated for it (429).
		// Any other request is never refused, nor moved, for saturation.
		kept := r.keepCapacity(scored, candidates)
		if kept == 0 {
			if !req.Held {
				r.deps.Metrics.shed()
			}
			return nil, ErrSaturated
		}
		scored, candidates = scored[:kept], candidates[:kept]
	} else if req.HoldOnSaturation && r.saturated(scored) {
		return nil, ErrSaturated
	}
	picked, err := r.deps.Picker.Pick(ctx, sreq, scored)
	if err != nil {
		if errors.Is(err, scoring.ErrNoCandidates) {
			return nil, ErrNoWorkers
		}
		var fe *scoring.FieldError
		if errors.As(err, &fe) {
			return nil, fmt.Errorf("%w: policy override %v", ErrBadRequest, err)
		}
		return nil, fmt.Errorf("router: pick: %w", err)
	}
	chosen := candidates[picked.Chosen]
	cached := picked.Terms[picked.Chosen].Overlap * r.blockSize
	offloaded := picked.Terms[picked.Chosen].OffloadedBlocks * r.blockSize
	switch {
	case !prefillFleet || fit.exceeded:
	case req.Whole:
		split = wholeSplit(isl - cached - offloaded)
	default:
		// What the destination can load from its host memory is not missing: a prefill
		// worker would compute it and send it over a network instead.
		split, err = r.splitPrefill(ctx, req, sreq, &sc.prefill, blocks, isl-cached-offloaded, priority.Sheddable(requestPriority))
		if err != nil {
			return nil, err
		}
	}
	// The destination computes what it does not hold, a block it loads from its host
	// memory counting as the cost counts it, unless a prefill worker computes the
	// prompt and sends the KV over.
	destinationPrefill := r.capToContext(computedTokens(isl, picked.Terms[picked.Chosen], r.blockSize), chosen, req.Model)
	if split.prefill != nil {
		destinationPrefill = 0
	}
	// Each booking adds its prefill to the worker's prefill history, decayed with the
	// half-life in force for the request (prefill_history_half_life).
	halfLife := r.params(sreq).PrefillHistoryHalfLife
	// A refused prompt does not load the request's LoRA adapter either: booked with it,
	// the adapter would count as running on the worker (then resident for
	// lora_residency), a slot taken for the cost's lora_weight and for the peers.
	adapter := req.LoRA
	if fit.exceeded {
		adapter = ""
	}
	booking = r.deps.Bookings.BookSequences(chosen.Name, adapter, blocks, destinationPrefill, halfLife, req.Sequences)
	if split.prefill != nil {
		computed := r.capToContext(computedTokens(isl, split.prefill.Terms[split.prefill.Chosen], r.blockSize), split.prefill.worker, req.Model)
		split.prefill.booking = r.deps.Bookings.BookDecision(split.prefill.Worker, req.LoRA, blocks, computed, halfLife)
	}
	recorded[0], records = recordedBlocks{chosen.Name, blocks[picked.Terms[picked.Chosen].Overlap:]}, 1
	if err := r.record(chosen.Name, chosen.Address, blocks, session); err != nil {
		return nil, err
	}
	if split.prefill != nil {
		// The prefill worker computes the blocks and keeps them cached after sending.
		recorded[1], records = recordedBlocks{split.prefill.Worker, blocks[split.prefill.Terms[split.prefill.Chosen].Overlap:]}, 2
		if err := r.record(split.prefill.Worker, split.prefill.Address, blocks, ""); err != nil {
			return nil, err
		}
	}
	if session != "" && r.deps.Sessions != nil {
		r.deps.Sessions.Remember(session, chosen.Name)
	}
	done = true
	r.decideMu.Unlock()
	scoredAt := r.deps.Now()
	// The prompt is counted with its decision, as the context fit and the stored
	// response are: a request refused (a 429 for capacity, tried again while flow
	// control holds it) is not routed by load nor on its first ids.
	r.prompter.Metrics.prompt(prompt)
	r.prompter.Metrics.contextFit(fit)
	r.deps.Metrics.storedResponse(storedResponse) // routed: a refusal (429) is not counted
	r.deps.Metrics.sglangSession(sglangSession)

	fallbacks := make([]string, len(picked.Fallbacks))
	for i, c := range picked.Fallbacks {
		fallbacks[i] = candidates[c].Address
	}
	return &Decision{
		Decision:              picked,
		Address:               chosen.Address,
		FallbackAddresses:     fallbacks,
		Model:                 req.Model,
		LoRA:                  req.LoRA,
		PromptTokens:          promptTokens,
		PromptEstimatedTokens: prompt.EstimatedTokens,
		Blocks:                promptBlocks,
		PredictedCachedTokens: cached,
		AllOut:                allOut,
		LoRAUnlisted:          unlisted.lora,
		ModelUnlisted:         unlisted.model,
		Prefill:               split.prefill,
		DecodeOnly:            split.decodeOnly,
		MissingTokens:         split.missing,
		PromptFallback:        prompt.Fallback,
		ContextNarrowed:       fit.narrowed,
		ContextExceeded:       fit.exceeded,
		Objective:             req.Objective,
		Priority:              requestPriority,
		Rewrite:               req.Rewrite,
		RewriteHeader:         req.RewriteHeader,
		RequestedModel:        req.RequestedModel,
		StoredResponse:        storedResponse,
		SGLangSession:         sglangSession,
		modes:                 r.modes,
		Timings: Timings{
			Tokenize: tokenized.Sub(start),
			Hash:     hashed.Sub(tokenized),
			Lookup:   looked.Sub(hashed),
			Score:    scoredAt.Sub(looked),
		},
		booking: booking,
		router:  r,
		blocks:  blocks,
		session: session,
	}, nil
}

// How a request naming a stored response was routed (Decision.StoredResponse), or one
// naming an SGLang session (Decision.SGLangSession, where "stored" means opened).
const (
	// StoredResponseWorker: to the worker that stored it, the only candidate.
	StoredResponseWorker = "stored_worker"
	// StoredResponseUnknown: by the cost among every candidate, as no response of that
	// id was seen (stored before a restart of kvroute, on another replica, past
	// responses.max_entries or responses.ttl, or never).
	StoredResponseUnknown = "unknown"
	// StoredResponseNotCandidate: by the cost among every candidate, as the worker that
	// stored it is not one for this request (it does not serve the model, or is outside
	// the GIE subset). A worker that left the fleet, or whose address changed, took its
	// responses with it: they are forgotten then.
	StoredResponseNotCandidate = "not_candidate"
)

// destinations are a request's candidates as a decision takes them (destinationsOf).
type destinations struct {
	// candidates are the destinations, prefills the prefill workers (candidates).
	candidates, prefills []Worker
	// allOut: every destination was out for a health back-off, so all are candidates;
	// prefillFleet: some prefill worker serves the model (candidates).
	allOut, prefillFleet bool
	unlisted             unlistedBy
	storedResponse       string // storedBy's of the response
	sglangSession        string // storedBy's of the SGLang session
	fit                  contextFit
}

// destinationsOf are req's candidates now, as Route takes them: the eligible workers
// serving its model (candidates), narrowed to the one that stored the response it
// names (storedBy) and, for a prompt of fitTokens exact ids (0: not checked), to the
// workers whose contexts fit it (fitContext). They live in sc. Router.StillWaits asks
// it too: a request waits only for a worker a decision would choose among.
func (r *Router) destinationsOf(req *Request, sc *scratch, fitTokens int) (d destinations, err error) {
	d.candidates, d.prefills, d.allOut, d.prefillFleet, d.unlisted, err = r.candidates(req, sc, sc.candidates[:0], sc.prefill.candidates[:0])
	if err != nil {
		return destinations{}, err
	}
	if stored := r.deps.Responses; stored != nil && req.PreviousResponseID != "" {
		d.candidates, d.storedResponse = r.storedBy(stored.KeyOf(req.PreviousResponseID), d.candidates, sc.out, d.allOut)
	}
	if stored := r.deps.Responses; stored != nil && req.SGLangSession != "" {
		d.candidates, d.sglangSession = r.storedBy(stored.SGLangSessionKeyOf(req.SGLangSession), d.candidates, sc.out, d.allOut)
		if req.OpensSGLangSession && d.sglangSession != StoredResponseWorker {
			d.sglangSession = "" // a new session's id: nothing is amiss
		}
	}
	if fitTokens > 0 {
		d.candidates, d.prefills, d.fit = r.fitContext(req.Model, fitTokens, req.MaxTokens, d.candidates, d.prefills)
		if d.fit.exceeded && !d.allOut && len(sc.out) > 0 {
			// Every eligible destination's engine refuses the prompt for sure (a 400
			// telling the client to shorten a prompt the fleet can serve): those out for
			// a health back-off that it fits may serve it, and are chosen among, as when
			// every candidate is out.
			if fitting, _, outFit := r.fitContext(req.Model, fitTokens, req.MaxTokens, sc.out, nil); !outFit.exceeded {
				d.candidates, d.allOut, d.fit = append(d.candidates[:0], fitting...), true, contextFit{narrowed: true}
			}
		}
	}
	sc.candidates, sc.prefill.candidates = d.candidates, d.prefills
	return d, nil
}

// storedBy narrows the candidates to the worker Deps.Responses keeps under key (a
// stored response's, or an SGLang session's) when it is one of them (out for a health back-off or
// not), and says how the request is routed (Decision.StoredResponse,
// Decision.SGLangSession). out holds the candidates left out for a back-off when
// allOut is false.
func (r *Router) storedBy(key uint64, candidates, out []Worker, allOut bool) ([]Worker, string) {
	worker, ok := r.deps.Responses.LookupKey(key)
	if !ok {
		return candidates, StoredResponseUnknown
	}
	if allOut {
		out = nil // candidates are every worker out, already
	}
	// One out for a back-off is still chosen: every other worker's engine answers 404.
	for _, pool := range [2][]Worker{candidates, out} {
		for _, w := range pool {
			if w.Name == worker {
				return append(candidates[:0], w), StoredResponseWorker
			}
		}
	}
	return candidates, StoredResponseNotCandidate
}

// RememberResponse records that the worker that served the request stored the
// Responses API response id (read from the response): a request naming it later is
// sent there. Nothing for a router without Deps.Responses.
//
// A worker that moved (another engine at a new address) or left the fleet since the
// decision took its responses with it, as SetWorkers forgets them: its id is not
// remembered. The check and the record are made under the workers' lock, which
// SetWorkers takes before it forgets, so that either the change sees the record or the
// record sees the change.
func (d *Decision) RememberResponse(id string) {
	if id != "" && d.router != nil && d.router.deps.Responses != nil {
		d.remember(d.router.deps.Responses.KeyOf(id))
	}
}

// RememberSGLangSession records that the worker that served the request holds the
// SGLang session id: the one whose /open_session it answered (id read from the
// response), or whose turn it served (which keeps the session from being forgotten
// after responses.ttl while in use). A request naming the session later is sent there.
// Nothing for a router without Deps.Responses; a moved worker's session is not
// remembered, as in RememberResponse.
func (d *Decision) RememberSGLangSession(id string) {
	if id != "" && d.router != nil && d.router.deps.Responses != nil {
		d.remember(d.router.deps.Responses.SGLangSessionKeyOf(id))
	}
}

// remember is RememberResponse's and RememberSGLangSession's record of what the
// serving worker holds, by its key in Deps.Responses (which the caller checked is set).
func (d *Decision) remember(key uint64) {
	r := d.router
	worker, address := d.Worker, d.Address
	if d.served != "" {
		worker, address = d.served, d.servedAddress
	}
	r.workersMu.RLock()
	if r.addresses[worker] != address {
		r.workersMu.RUnlock()
		return
	}
	r.deps.Responses.RememberKey(key, worker)
	r.workersMu.RUnlock()
	if sink := r.deps.ResponseRecords; sink != nil {
		sink.RecordedResponse(worker, address, key)
	}
}

// resolveAdapter returns req as its base model sees it when its model is a LoRA
// adapter: the base model picks the workers and the tokenizer, the adapter salts the
// blocks (unless req.BaseOnly: the engine runs the base, with req.LoRA, the adapter the
// body names apart, if any). The caller's request is left as it was.
func (r *Router) resolveAdapter(req *Request) *Request {
	if req.LoRA != "" && !req.BaseOnly {
		return req
	}
	base, ok := r.adapters[req.Model]
	if !ok && r.deps.ModelLists != nil {
		// An adapter the config does not declare, loaded at run time: the engines' lists
		// name its base model. A name the config's workers serve as a model stays one.
		if base, ok = r.deps.ModelLists.BaseOf(req.Model); ok && r.servedAsModel(req.Model) {
			ok = false
		}
	}
	if !ok {
		return req
	}
	resolved := *req
	resolved.Model = base
	if !req.BaseOnly {
		resolved.LoRA = req.Model
	}
	return &resolved
}

// servedAsModel reports whether some worker lists model among its models.
func (r *Router) servedAsModel(model string) bool {
	r.workersMu.RLock()
	defer r.workersMu.RUnlock()
	for _, w := range r.workers {
		if slices.Contains(w.Models, model) {
			return true
		}
	}
	return false
}

// lookUp fills each candidate's overlap, offloaded run and cache footprint from the
// index, with one backing array (*buf, a scratch's, grown as needed) for the four
// per-candidate lookups.
func (r *Router) lookUp(buf *[]int, blocks []uint64, names []string, scored []scoring.Candidate) {
	n := len(names)
	ints := slices.Grow((*buf)[:0], 4*n)[:4*n]
	*buf = ints
	overlaps, offloaded, held, capacity := ints[:n], ints[n:2*n], ints[2*n:3*n], ints[3*n:]
	r.deps.Index.Overlaps(blocks, names, overlaps)
	if r.offload != nil {
		r.offload.Offloaded(blocks, names, overlaps, offloaded)
	} else {
		clear(offloaded)
	}
	r.deps.Index.Footprints(names, held, capacity)
	for i := range scored {
		scored[i].Overlap, scored[i].OffloadedBlocks = overlaps[i], offloaded[i]
		scored[i].HeldBlocks, scored[i].CapacityBlocks = held[i], capacity[i]
	}
}

// checkServed refuses a request no worker could take whatever their state: there are
// no workers, or none serves its model. candidates says the rest after tokenization.
func (r *Router) checkServed(req *Request) error {
	r.workersMu.RLock()
	defer r.workersMu.RUnlock()
	if len(r.workers) == 0 {
		return ErrNoWorkers
	}
	prefillOnly := false
	for _, w := range r.workers {
		if req.AnyModel || w.serves(req.Model) {
			if !w.prefills() {
				return nil
			}
			prefillOnly = true
		}
	}
	if prefillOnly {
		return fmt.Errorf("%w (%q)", ErrOnlyPrefillWorkers, req.Model)
	}
	return notServed(req)
}

// notServed is ErrModelNotFound for req, naming the adapter a base model was asked for.
func notServed(req *Request) error {
	if req.LoRA != "" {
		return fmt.Errorf("%w: %q (the base model of LoRA adapter %q)", ErrModelNotFound, req.Model, req.LoRA)
	}
	return fmt.Errorf("%w: %q", ErrModelNotFound, req.Model)
}

// candidates appends the eligible destinations to out in configured order, and
// reports whether health was ignored because every worker that serves the request was
// out. The eligible prefill workers serving the request's model go to prefill (health
// is not ignored for them: with none left, the destination prefills); prefillFleet says
// whether any prefill worker serves it at all. For a LoRA adapter request only the
// workers that may serve the adapter, and of those configured without models only the
// ones whose engines list the model ([Router.listFilter]), are candidates; unlisted
// says which lists were set aside because no destination lists the adapter or model.
func (r *Router) candidates(req *Request, sc *scratch, out, prefill []Worker) (dest, prefills []Worker, allOut, prefillFleet bool, unlisted unlistedBy, err error) {
	r.workersMu.RLock()
	defer r.workersMu.RUnlock()
	sc.out = sc.out[:0]
	may, unlisted := r.listFilter(req, sc)
	if may != nil && !slices.Contains(may, true) {
		if req.LoRA == "" { // a reload took the model away since checkServed
			return nil, nil, false, false, unlistedBy{}, notServed(req)
		}
		return nil, nil, false, false, unlistedBy{}, fmt.Errorf("%w: %q: no worker of %q serves the LoRA adapter (workers[].lora_adapters)", ErrModelNotFound, req.LoRA, req.Model)
	}
	servesModel, anyOut, anyDestination := false, false, false
	for i := range r.workers {
		w := &r.workers[i] // copied only into out, prefill or sc.out
		if !req.AnyModel && !w.serves(req.Model) {
			continue
		}
		servesModel = true
		if may != nil && !may[i] {
			continue
		}
		anyDestination = anyDestination || !w.prefills()
		if w.prefills() {
			// A prefill worker is never the destination; a load-only request (no
			// prompt) has nothing to prefill. The GIE subset hint holds for it too: it
			// names every endpoint the picker may choose (llm-d's picker filters all
			// its profiles' candidates by it).
			if !req.AnyModel {
				prefillFleet = true
				if (r.deps.Health == nil || r.deps.Health.Eligible(w.Name)) && req.inSubset(w) {
					prefill = append(prefill, *w)
				}
			}
			continue
		}
		if !req.inSubset(w) {
			continue
		}
		if r.deps.Health != nil && !r.deps.Health.Eligible(w.Name) {
			anyOut = true
			sc.out = append(sc.out, *w)
			continue
		}
		out = append(out, *w)
	}
	if !servesModel && len(r.workers) > 0 {
		return nil, nil, false, false, unlistedBy{}, notServed(req)
	}
	if len(out) > 0 {
		return out, prefill, false, prefillFleet, unlisted, nil
	}
	if !anyOut {
		if !anyDestination && prefillFleet && req.LoRA != "" {
			// Only prefill workers' own lora_adapters name the adapter: a config error,
			// said as such rather than as a fleet without workers.
			return nil, nil, false, false, unlistedBy{}, fmt.Errorf("%w (LoRA adapter %q of %q)", ErrOnlyPrefillWorkers, req.LoRA, req.Model)
		}
		return nil, nil, false, false, unlistedBy{}, ErrNoWorkers
	}
	// Every candidate is out: route among all of them (see Deps.Health).
	for i := range r.workers {
		if w := &r.workers[i]; (req.AnyModel || w.serves(req.Model)) && (may == nil || may[i]) && !w.prefills() && req.inSubset(w) {
			out = append(out, *w)
		}
	}
	return out, prefill, true, prefillFleet, unlisted, nil
}

// unlistedBy says which engine lists a decision set aside (listFilter).
type unlistedBy struct{ lora, model bool }

// inSubset reports whether w may be the request's destination under the GIE endpoint
// subset hint (always, without one): an entry names its address, or, without a port,
// its IP (every port of a pod, as GIE's reference picker reads such an entry:
// pkg/lwepp/handlers/request.go).
func (req *Request) inSubset(w *Worker) bool {
	if req.Subset == nil {
		return true
	}
	host := w.Address
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = strings.TrimSuffix(strings.TrimPrefix(host[:i], "["), "]")
	}
	for _, e := range req.Subset {
		if e == w.Address || e == host {
			return true
		}
	}
	return false
}

// listFilter returns which workers (by index in r.workers) may serve req, beyond the
// models they are configured with. For a LoRA adapter request, a worker with its own
// lora_adapters serves those, otherwise its engine's model list says; a worker
// configured without models (it serves every model) serves the base models its
// engine's list names. Each worker is asked once: the lists change under a decision.
//
// The lists narrow, they never refuse. A worker whose list is unknown may serve
// anything, but only a list that names the model (or the adapter), or a worker's
// config, is evidence: when no destination the request can reach (not a prefill
// worker, inside the GIE subset) has that evidence, the lists are set aside, first
// the adapter lists (the adapter goes to the engines of its base model, which may
// load it on demand: vLLM's LoRA resolvers), then the base-model lists (every worker
// configured to serve the model, as without lists), and the decision says so
// (unlisted). A list may be out of date, an engine may take names
// it does not list, and a refusal here would only replace the engine's. Workers' own
// lora_adapters always hold. nil means every worker (lists not used, or not needed).
// r.workersMu is held; the result lives in sc.
func (r *Router) listFilter(req *Request, sc *scratch) (may []bool, unlisted unlistedBy) {
	if req.AnyModel {
		return nil, unlistedBy{}
	}
	lists := r.deps.ModelLists
	adapter := req.LoRA != ""
	if !adapter && (lists == nil || !r.anyOpen) {
		return nil, unlistedBy{}
	}
	adapterLists := lists
	if r.loraOnDemand {
		adapterLists = nil // every worker may load any adapter: the lists only name them
	}
	n := len(r.workers)
	verdicts := slices.Grow(sc.verdicts[:0], n)[:n]
	sc.verdicts = verdicts
	for i := range r.workers {
		w, v := &r.workers[i], verdict(0)
		if w.serves(req.Model) {
			v |= configServes | baseMay | baseListed | adapterMay | adapterListed
			if !w.prefills() && req.inSubset(w) {
				v |= destination
			}
			if lists != nil && w.open() {
				serves, known := lists.ServesModel(w.Name, req.Model)
				v = v.set(baseMay, serves || !known).set(baseListed, serves)
			}
			switch {
			case adapter && len(w.LoRAAdapters) > 0:
				own := slices.Contains(w.LoRAAdapters, req.LoRA)
				v = v.set(adapterMay, own).set(adapterListed, own).set(ownAllows, own)
				if own && v&baseMay != 0 {
					// Its config names the adapter, so it serves the adapter's base model
					// (Config.Validate): evidence of the model too while its engine's list
					// is unknown. A known list that leaves the model out still does.
					v |= baseListed
				}
			case adapter && adapterLists != nil:
				v |= ownAllows
				serves, known := adapterLists.ServesAdapter(w.Name, req.LoRA)
				v = v.set(adapterMay, serves || !known).set(adapterListed, serves)
			default:
				v |= ownAllows
			}
		}
		verdicts[i] = v
	}
	may = slices.Grow(sc.may[:0], n)[:n]
	sc.may = may
	// The lists as they are; then without the adapter lists; then without any. Each
	// step stands when a destination it leaves has the evidence it asks.
	steps := [...]struct{ need, evidence verdict }{
		{baseMay | adapterMay, baseListed | adapterListed},
		{baseMay | ownAllows, baseListed},
		{configServes | ownAllows, 0},
	}
	for step, s := range steps {
		if step == 1 && !adapter {
			continue // the same as the first
		}
		reachable := false
		for i, v := range verdicts {
			may[i] = v&s.need == s.need
			reachable = reachable || (may[i] && v&destination != 0 && v&s.evidence == s.evidence)
		}
		if reachable || step == len(steps)-1 {
			return may, unlistedBy{lora: step > 0 && adapter && !adapterListedBy(verdicts, s.need), model: step == len(steps)-1}
		}
	}
	panic("unreachable: the last step returns")
}

// adapterListedBy reports whether some destination the step (its need) leaves the
// request names the adapter (its own lora_adapters or its engine's list). Under the
// adapter-lists-aside step, a worker whose base-model list leaves the model out does
// not count: the request went to workers whose lists leave the adapter out, which is
// what lora_unlisted marks. Under the last step, the base-model lists are set aside too.
func adapterListedBy(verdicts []verdict, need verdict) bool {
	want := destination | adapterListed | configServes | need
	return slices.ContainsFunc(verdicts, func(v verdict) bool { return v&want == want })
}

// verdict is what the config and the lists say of one worker for one request
// (listFilter).
type verdict uint8

const (
	configServes  verdict = 1 << iota // its config serves the model
	destination                       // a destination: not a prefill worker, inside the GIE subset
	baseMay                           // its base-model list names the model, is unknown, or is not used
	baseListed                        // the model is in its config (or its lora_adapters name the adapter), or its list names it
	adapterMay                        // the adapter: its own list or its engine's names it, or unknown
	adapterListed                     // the adapter: named by its own list or its engine's (or not needed)
	ownAllows                         // its own lora_adapters name the adapter, or it has none
)

func (v verdict) set(flag verdict, on bool) verdict {
	if on {
		return v | flag
	}
	return v &^ flag
}
