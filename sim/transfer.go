package sim

import "time"

// The KV transfer model of disaggregated prefill/decode (TransferTime).
const (
	// TransferFixed is a transfer's fixed part: the routing sidecar's extra HTTP hop
	// to the prefill worker's answer and the NIXL handshake before the read.
	TransferFixed = 2 * time.Millisecond
	// TransferPerToken is a transferred token's part: about 128 KiB of KV per token
	// for an 8B model (32 layers × 8 KV heads × 128 dims × K and V × 2 bytes) read at
	// about 25 GB/s.
	TransferPerToken = 5 * time.Microsecond
)

// TransferTime is the time a decode worker takes to read tokens' KV from a prefill
// worker: TransferFixed plus TransferPerToken per token. 0 tokens (or fewer) cost the
// fixed part alone.
func TransferTime(tokens int) time.Duration {
	return TransferFixed + time.Duration(max(tokens, 0))*TransferPerToken
}

// HostLoadPerToken is the time to load one token's KV from the host tier
// (Config.HostBlocks) into device blocks: about 128 KiB per token for an 8B model, as
// for TransferPerToken, copied over PCIe at about 25 GB/s. A load has no fixed part: it
// is a local copy with no handshake, and a kernel launch's few microseconds are lost in
// a pass's milliseconds.
const HostLoadPerToken = 5 * time.Microsecond

// HostLoadTime is the time to load tokens' KV from the host tier: HostLoadPerToken per
// token, none for 0 tokens (or fewer). The engine adds it to the duration of the pass
// that admits the request. vLLM's offloading connector loads asynchronously while the
// request waits, before the pass that computes it; charging the load to the pass is
// the conservative simplification, as it slows the pass's other requests too.
func HostLoadTime(tokens int) time.Duration {
	return time.Duration(max(tokens, 0)) * HostLoadPerToken
}
