package router

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// KVEvents is where a worker's engine publishes its KV cache events (the worker's
// `kv_events` key; ../shared/KV_EVENTS.md). With it, the index learns what the engine
// really holds from the engine itself (package kvevents).
type KVEvents struct {
	// Endpoint is the engine's PUB endpoint, `tcp://host:port` or `ipc:///path`. It may
	// be a template: `{ip}` is replaced by the worker's address's IP (bracketed for
	// IPv6), so one line serves every worker, including those found by discovery.
	Endpoint string `yaml:"endpoint" json:"endpoint"`
	// Bind makes kvroute bind Endpoint and the engine connect to it (an engine whose
	// endpoint names a host rather than `*` dials out). Off: kvroute connects.
	Bind bool `yaml:"bind,omitempty" json:"bind,omitempty"`
	// Topic is the topic subscribed to (a prefix; empty: every message, vLLM's default).
	// `{ip}` is filled as in Endpoint. A topic of the form `kv@<ip>@<model>` names the
	// worker's model.
	Topic string `yaml:"topic,omitempty" json:"topic,omitempty"`
	// ReplayEndpoint is the engine's ROUTER replay endpoint (a template like Endpoint);
	// empty when the engine has none. With it, a gap in the sequence is replayed rather
	// than the worker's entries cleared.
	ReplayEndpoint string `yaml:"replay_endpoint,omitempty" json:"replay_endpoint,omitempty"`
	// DataParallelSize is the number of data-parallel ranks behind the worker's address
	// (0 means 1): rank r publishes on Endpoint's port + r and replays on
	// ReplayEndpoint's port + r. The worker holds the union of its ranks' blocks.
	DataParallelSize int `yaml:"data_parallel_size,omitempty" json:"data_parallel_size,omitempty"`
	// OffloadBlockSize, when above 0, is this worker's offloaded block size in tokens
	// for events that send block_size 0 with hash-only host stores, in place of the
	// fleet-wide kv_events.offload_block_size: a fleet whose engines offload in
	// different block sizes. A multiple of block_size.
	OffloadBlockSize int `yaml:"offload_block_size,omitempty" json:"offload_block_size,omitempty"`
	// FirstRank is the data-parallel rank of the worker's first stream (0 for a
	// configured worker): its ranks publish on Endpoint's port + FirstRank + r. Set by
	// Kubernetes discovery for a pod serving ranks on several target ports, each port
	// its own worker (vLLM offsets a rank's event ports by its rank).
	FirstRank int `yaml:"-" json:"first_rank,omitempty"`
}

// maxDataParallelSize bounds data_parallel_size: one subscription per rank.
const maxDataParallelSize = 256

// maxOffloadBlockSize bounds offload_block_size, as the events' own block_size is.
const maxOffloadBlockSize = 1 << 20

// Ranks returns the number of data-parallel ranks (at least 1).
func (k KVEvents) Ranks() int { return max(k.DataParallelSize, 1) }

// Streams is one worker's KV event streams, resolved for its address.
type Streams struct {
	// Endpoints[r] is rank r's PUB endpoint (to connect to, or to bind when Bind).
	Endpoints []string
	// Replay[r] is rank r's replay endpoint; nil when the engine has none.
	Replay []string
	Bind   bool
	Topic  string
}

// Resolve fills the templates for a worker at address (ip:port) and offsets each
// rank's ports.
func (k KVEvents) Resolve(address string) (Streams, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return Streams{}, fmt.Errorf("address %q: %w", address, err)
	}
	ip := ap.Addr().Unmap().String()
	if ap.Addr().Unmap().Is6() {
		ip = "[" + ip + "]"
	}
	fill := func(s string) string { return strings.ReplaceAll(s, "{ip}", ip) }
	s := Streams{Bind: k.Bind, Topic: fill(k.Topic)}
	for r := k.FirstRank; r < k.FirstRank+k.Ranks(); r++ {
		ep, err := rankEndpoint(fill(k.Endpoint), r, k.Bind)
		if err != nil {
			return Streams{}, fmt.Errorf("endpoint: %w", err)
		}
		s.Endpoints = append(s.Endpoints, ep)
		if k.ReplayEndpoint != "" {
			rp, err := rankEndpoint(fill(k.ReplayEndpoint), r, false)
			if err != nil {
				return Streams{}, fmt.Errorf("replay_endpoint: %w", err)
			}
			s.Replay = append(s.Replay, rp)
		}
	}
	return s, nil
}

// rankEndpoint checks an endpoint and offsets its port by rank, as vLLM does.
func rankEndpoint(ep string, rank int, bind bool) (string, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	switch {
	case !ok:
		return "", fmt.Errorf("%q: want tcp://host:port or ipc:///path", ep)
	case scheme == "ipc":
		if rest == "" {
			return "", fmt.Errorf("%q: ipc endpoint without a path", ep)
		}
		if rank > 0 {
			return "", fmt.Errorf("%q: an ipc endpoint serves one rank; data_parallel_size needs tcp", ep)
		}
		return ep, nil
	case scheme != "tcp":
		return "", fmt.Errorf("%q: unsupported transport %q (tcp, ipc)", ep, scheme)
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", fmt.Errorf("%q: no port", ep)
	}
	host, portText := rest[:i], rest[i+1:]
	port, err := strconv.Atoi(portText)
	if err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("%q: port must be 1-65535 for every rank", ep)
	}
	if host == "" || strings.ContainsAny(host, "{}/ ") || (!bind && host == "*") {
		return "", fmt.Errorf("%q: bad host %q (a connect endpoint names the engine's host; unfilled templates allow only {ip})", ep, host)
	}
	return "tcp://" + host + ":" + strconv.Itoa(port+rank), nil
}

// TopicModel returns the model named by a `kv@<ip>@<model>` topic, or "".
func TopicModel(topic string) string {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return ""
	}
	_, model, ok := strings.Cut(rest, "@")
	if !ok {
		return ""
	}
	return model
}

// EventModel returns the one model an event-mode worker serves: its models entry, or
// the model its topic names. Events carry no model name, and the model salts the
// hashes recomputed from them, so an event-mode worker serves exactly one.
func (w Worker) EventModel() string {
	if len(w.Models) == 1 {
		return w.Models[0]
	}
	if w.KVEvents != nil {
		return TopicModel(w.KVEvents.Topic)
	}
	return ""
}

// ValidateKVEvents checks a worker's kv_events (path is the worker's YAML path): the
// config's workers, and each worker discovery derives from a kv_events template.
func (w Worker) ValidateKVEvents(path string) error {
	k := w.KVEvents
	if k == nil {
		return nil
	}
	path += ".kv_events"
	if k.Endpoint == "" {
		return fmt.Errorf("%s.endpoint: must not be empty", path)
	}
	if k.DataParallelSize < 0 || k.DataParallelSize > maxDataParallelSize {
		return fmt.Errorf("%s.data_parallel_size: must be 0-%d, got %d", path, maxDataParallelSize, k.DataParallelSize)
	}
	if k.OffloadBlockSize < 0 || k.OffloadBlockSize > maxOffloadBlockSize {
		return fmt.Errorf("%s.offload_block_size: must be from 0 (kv_events.offload_block_size) to %d tokens, got %d", path, maxOffloadBlockSize, k.OffloadBlockSize)
	}
	if _, err := k.Resolve(w.Address); err != nil {
		return fmt.Errorf("%s.%w", path, err)
	}
	topicModel := TopicModel(k.Topic)
	switch {
	case len(w.Models) > 1:
		return fmt.Errorf("%s: an event-mode worker serves exactly one model (its events do not say which), got models %q", path, w.Models)
	case len(w.Models) == 0 && topicModel == "":
		return fmt.Errorf("%s: an event-mode worker serves exactly one model: set models: [name] or a topic kv@<ip>@<model>", path)
	case len(w.Models) == 1 && topicModel != "" && topicModel != w.Models[0]:
		return fmt.Errorf("%s.topic: names model %q but models is %q", path, topicModel, w.Models[0])
	}
	return nil
}
