package router

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Config configures a [Router].
type Config struct {
	// BlockSize is the engines' KV block size in tokens (vLLM's --block-size).
	BlockSize int `yaml:"block_size" json:"block_size"`
	// Workers is the fleet, in the stable order candidates are visited.
	Workers []Worker `yaml:"workers" json:"workers"`
	// MaxActiveRequestsPerWorker sheds load (DESIGN §6: 429): a worker with this many
	// requests active through kvroute is not a candidate, and a request every candidate
	// is full for is refused with ErrOverloaded. 0 never sheds.
	MaxActiveRequestsPerWorker int `yaml:"max_active_requests_per_worker" json:"max_active_requests_per_worker"`
	// LoRAAdapters are the LoRA adapters requests may name as their model. A request
	// for an adapter runs on the workers serving its base model, is encoded by the base
	// model's tokenizer, and its blocks are salted by the adapter's name, as the engine
	// salts them: an adapter's KV cache is its own.
	LoRAAdapters []LoRAAdapter `yaml:"lora_adapters,omitempty" json:"lora_adapters,omitempty"`
	// LoRAResidency is how long an adapter counts as resident on a worker after its last
	// request there ended, for the cost's lora_weight: its sessions' next turns come
	// back to the worker holding their cache. 0: only while it has requests.
	LoRAResidency time.Duration `yaml:"lora_residency" json:"lora_residency"`
	// LoRAOnDemand says the engines load a LoRA adapter on its first request (vLLM's
	// LoRA resolvers, VLLM_ALLOW_RUNTIME_LORA_UPDATING): every worker of the base model
	// may serve any adapter, so the engines' model lists (which name only the adapters
	// loaded so far) do not narrow the candidates; they still name undeclared adapters'
	// base models. A worker's own lora_adapters still does.
	LoRAOnDemand bool `yaml:"lora_on_demand" json:"lora_on_demand"`
}

// DefaultLoRAResidency outlasts a chat session's pauses between turns (replay: 5 s to
// 120 s made no difference on sessions pausing up to 1.75 s; docs/BENCHMARKS.md).
const DefaultLoRAResidency = 30 * time.Second

// maxLoRAResidency bounds lora_residency: an adapter unused for an hour is not a
// session's.
const maxLoRAResidency = time.Hour

// LoRAAdapter is one LoRA adapter an engine serves beside its base model (vLLM's
// --lora-modules name=path, or one loaded at run time).
type LoRAAdapter struct {
	// Name is the adapter's name: the model requests name, and the lora_name of its
	// blocks' KV events.
	Name string `yaml:"name" json:"name"`
	// BaseModel is the model the adapter was trained on, as workers' models name it.
	BaseModel string `yaml:"base_model" json:"base_model"`
}

// maxLoRAAdapters bounds the adapters a config may declare: far more than an engine
// serves (vLLM's --max-cpu-loras), and a table lookup per request whatever the count.
const maxLoRAAdapters = 10000

// adapterBases maps each adapter's name to its base model.
func adapterBases(adapters []LoRAAdapter) map[string]string {
	if len(adapters) == 0 {
		return nil
	}
	bases := make(map[string]string, len(adapters))
	for _, a := range adapters {
		bases[a.Name] = a.BaseModel
	}
	return bases
}

// validateLoRAAdapters reports the first invalid lora_adapters entry.
func validateLoRAAdapters(adapters []LoRAAdapter) error {
	if len(adapters) > maxLoRAAdapters {
		return fmt.Errorf("lora_adapters: at most %d adapters, got %d", maxLoRAAdapters, len(adapters))
	}
	bases := adapterBases(adapters)
	seen := make(map[string]bool, len(adapters))
	for i, a := range adapters {
		path := fmt.Sprintf("lora_adapters[%d]", i)
		switch {
		case a.Name == "":
			return fmt.Errorf("%s.name: must not be empty", path)
		case seen[a.Name]:
			return fmt.Errorf("%s.name: duplicate adapter %q", path, a.Name)
		case a.BaseModel == "":
			return fmt.Errorf("%s.base_model: must not be empty (the model %q was trained on, as workers' models name it)", path, a.Name)
		case a.BaseModel == a.Name:
			return fmt.Errorf("%s.base_model: an adapter is not its own base model (%q)", path, a.Name)
		}
		if _, ok := bases[a.BaseModel]; ok {
			return fmt.Errorf("%s.base_model: %q is itself an adapter: engines stack no adapters", path, a.BaseModel)
		}
		seen[a.Name] = true
	}
	return nil
}

// MaxWorkerName bounds a worker's name in bytes: the other replicas refuse a load
// report naming a longer one (peers.MaxWorkerName), which would hide every worker's
// load and records from them. Kubernetes names are at most 253.
const MaxWorkerName = 512

// Worker is one inference server.
type Worker struct {
	// Name identifies the worker in metrics, logs and the index.
	Name string `yaml:"name" json:"name"`
	// Address is the literal ip:port Envoy's ORIGINAL_DST cluster connects to.
	Address string `yaml:"address" json:"address"`
	// Models lists the models the worker serves; empty means every model, narrowed to
	// the base models its engine's model list names when that list is known
	// (Deps.ModelLists).
	Models []string `yaml:"models,omitempty" json:"models,omitempty"`
	// CapacityBlocks is the worker's KV cache capacity in blocks (num_gpu_blocks); 0
	// takes the index default.
	CapacityBlocks int `yaml:"capacity_blocks,omitempty" json:"capacity_blocks,omitempty"`
	// MaxNumSeqs is the worker's batch slots (vLLM's --max-num-seqs), which engines do
	// not export; with it the cost sees a request that would wait for a slot before the
	// engine queues it. 0 means unknown.
	MaxNumSeqs int `yaml:"max_num_seqs,omitempty" json:"max_num_seqs,omitempty"`
	// MaxLoRAs is how many LoRA adapters the worker runs at once (vLLM's --max-loras,
	// default 1 there), read by the cost's lora_weight. 0 means unknown.
	MaxLoRAs int `yaml:"max_loras,omitempty" json:"max_loras,omitempty"`
	// MaxModelLen is the worker's context in tokens (vLLM's --max-model-len): its
	// engine refuses a prompt of that many tokens or more, so such a prompt goes to a
	// worker it fits, and books no prefill where it fits none. 0 takes its engine's
	// model list's (Deps.ContextLengths), else unknown.
	MaxModelLen int `yaml:"max_model_len,omitempty" json:"max_model_len,omitempty"`
	// LoRAAdapters, when set, are the only lora_adapters the worker serves (its
	// engine's --lora-modules): their requests go to no other worker. Unset, the
	// engine's model list says (engine_models), or else the worker serves every adapter
	// of its models.
	LoRAAdapters []string `yaml:"lora_adapters,omitempty" json:"lora_adapters,omitempty"`
	// KVEvents, when set, is where the worker's engine publishes its KV cache events.
	KVEvents *KVEvents `yaml:"kv_events,omitempty" json:"kv_events,omitempty"`
	// Role is the worker's part in disaggregated prefill and decode (llm-d's
	// llm-d.ai/role label): RolePrefill workers only prefill prompts for the decode
	// workers (and are never a request's destination); RoleDecode and RoleBoth workers
	// are destinations. "" means RoleBoth.
	Role string `yaml:"role,omitempty" json:"role,omitempty"`
	// Protocol is what kvroute's own requests to the worker (health probes, engine
	// metrics scrapes, the model list) speak: ProtocolHTTP ("" too) is HTTP/1.1,
	// ProtocolH2C HTTP/2 over cleartext with prior knowledge, for an engine served
	// only so (an InferencePool's appProtocol kubernetes.io/h2c), which refuses
	// HTTP/1.1. Routed requests go through Envoy, whose cluster says its own.
	Protocol string `yaml:"protocol,omitempty" json:"protocol,omitempty"`
}

// Worker protocols (Worker.Protocol).
const (
	ProtocolHTTP = "http"
	ProtocolH2C  = "h2c"
)

// H2C reports whether kvroute speaks HTTP/2 over cleartext to the worker.
func (w Worker) H2C() bool { return w.Protocol == ProtocolH2C }

// Worker roles (Worker.Role), as llm-d's llm-d.ai/role label names them.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
	RoleBoth    = "both"
)

// prefills reports whether the worker is a prefill worker, never a destination.
func (w Worker) prefills() bool { return w.Role == RolePrefill }

// open reports whether the worker is configured to serve every model: no models, and
// no KV events topic naming one. The engines' model lists narrow what it serves.
func (w Worker) open() bool { return len(w.Models) == 0 && w.KVEvents == nil }

// serves reports whether the worker's configuration lets it serve model.
func (w *Worker) serves(model string) bool {
	if len(w.Models) == 0 && w.KVEvents != nil {
		return model == w.EventModel() // the model of its kv@<ip>@<model> topic
	}
	return w.open() || slices.Contains(w.Models, model)
}

// DefaultBlockSize is the block size of the simulated workers kvroute is measured
// against (WORKLOADS §1). Set block_size to the engines' own: vLLM defaults to 16.
const DefaultBlockSize = 64

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	if c.BlockSize <= 0 {
		return fmt.Errorf("block_size: must be > 0, got %d", c.BlockSize)
	}
	if c.MaxActiveRequestsPerWorker < 0 {
		return fmt.Errorf("max_active_requests_per_worker: must be ≥ 0 (0: never shed), got %d", c.MaxActiveRequestsPerWorker)
	}
	if err := validateLoRAAdapters(c.LoRAAdapters); err != nil {
		return err
	}
	if c.LoRAResidency < 0 || c.LoRAResidency > maxLoRAResidency {
		return fmt.Errorf("lora_residency: must be in [0, %s], got %s", maxLoRAResidency, c.LoRAResidency)
	}
	bases := adapterBases(c.LoRAAdapters)
	names := make(map[string]bool, len(c.Workers))
	addrs := make(map[string]bool, len(c.Workers))
	for i, w := range c.Workers {
		path := fmt.Sprintf("workers[%d]", i)
		if w.Name == "" {
			return fmt.Errorf("%s.name: must not be empty", path)
		}
		if len(w.Name) > MaxWorkerName {
			return fmt.Errorf("%s.name: at most %d bytes, got %d", path, MaxWorkerName, len(w.Name))
		}
		if names[w.Name] {
			return fmt.Errorf("%s.name: duplicate worker name %q", path, w.Name)
		}
		names[w.Name] = true
		ap, err := netip.ParseAddrPort(w.Address)
		if err != nil || ap.Port() == 0 {
			return fmt.Errorf("%s.address: must be a literal ip:port (ORIGINAL_DST takes no host names), got %q", path, w.Address)
		}
		// Addresses are compared as strings wherever they meet another's spelling of
		// them (the GIE subset hint, duplicates here, a moved worker), so each has one:
		// Go's, which is the one Envoy and Kubernetes write (IPv6 in lower case, zeros
		// compressed, an IPv4-mapped address as IPv4).
		if canonical := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(); canonical != w.Address {
			return fmt.Errorf("%s.address: write %q as %q", path, w.Address, canonical)
		}
		if addrs[w.Address] {
			return fmt.Errorf("%s.address: duplicate address %q", path, w.Address)
		}
		addrs[w.Address] = true
		if w.CapacityBlocks < 0 {
			return fmt.Errorf("%s.capacity_blocks: must be ≥ 0, got %d", path, w.CapacityBlocks)
		}
		if w.MaxNumSeqs < 0 {
			return fmt.Errorf("%s.max_num_seqs: must be ≥ 0 (0: unknown), got %d", path, w.MaxNumSeqs)
		}
		if w.MaxLoRAs < 0 {
			return fmt.Errorf("%s.max_loras: must be ≥ 0 (0: unknown), got %d", path, w.MaxLoRAs)
		}
		if w.MaxModelLen < 0 || w.MaxModelLen > MaxContextLength {
			return fmt.Errorf("%s.max_model_len: must be in [0, %d] (0: the engine's model list says), got %d", path, MaxContextLength, w.MaxModelLen)
		}
		switch w.Role {
		case "", RolePrefill, RoleDecode, RoleBoth:
		default:
			return fmt.Errorf("%s.role: must be %s, %s or %s (empty: %s), got %q", path, RolePrefill, RoleDecode, RoleBoth, RoleBoth, w.Role)
		}
		switch w.Protocol {
		case "", ProtocolHTTP, ProtocolH2C:
		default:
			return fmt.Errorf("%s.protocol: must be %s or %s (empty: %s), got %q", path, ProtocolHTTP, ProtocolH2C, ProtocolHTTP, w.Protocol)
		}
		for j, m := range w.Models {
			if m == "" {
				return fmt.Errorf("%s.models[%d]: must not be empty", path, j)
			}
			if base, ok := bases[m]; ok {
				// A request for the adapter runs on the workers serving its base:
				// listing the adapter instead would match nothing.
				return fmt.Errorf("%s.models[%d]: %q is a LoRA adapter (lora_adapters): list its base model %q; a worker serving the base serves its adapters", path, j, m, base)
			}
		}
		if err := w.validateLoRAAdapters(path, bases); err != nil {
			return err
		}
		if err := w.ValidateKVEvents(path); err != nil {
			return err
		}
		if w.KVEvents != nil && w.KVEvents.OffloadBlockSize > 0 && c.BlockSize > 0 && w.KVEvents.OffloadBlockSize%c.BlockSize != 0 {
			return fmt.Errorf("%s.kv_events.offload_block_size: must be a multiple of block_size (%d), got %d", path, c.BlockSize, w.KVEvents.OffloadBlockSize)
		}
	}
	return nil
}

// validateLoRAAdapters checks the worker's own adapter list against the config's
// lora_adapters: each named once, declared, and of a base model the worker serves.
func (w Worker) validateLoRAAdapters(path string, bases map[string]string) error {
	for j, name := range w.LoRAAdapters {
		at := fmt.Sprintf("%s.lora_adapters[%d]", path, j)
		base, ok := bases[name]
		switch {
		case !ok:
			return fmt.Errorf("%s: %q is not in lora_adapters (declare it there with its base model)", at, name)
		case slices.Index(w.LoRAAdapters, name) < j:
			return fmt.Errorf("%s: %q is listed twice", at, name)
		case !w.serves(base):
			return fmt.Errorf("%s: %q is an adapter of %q, which the worker does not serve (models)", at, name, base)
		}
	}
	return nil
}
