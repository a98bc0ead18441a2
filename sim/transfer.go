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
