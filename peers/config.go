package peers

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// MaxAddresses bounds peers.addresses, and the addresses taken from one DNS answer.
const MaxAddresses = 64

// Config is the peers section: where the other replicas' admin ports are and how often
// to read them. With no addresses and no DNS name the exchange is off.
type Config struct {
	// Addresses are other replicas' admin addresses (host:port). This replica's own
	// address may be listed too: it is recognised by its id and skipped, so every
	// replica can share one list.
	Addresses []string `yaml:"addresses"`
	// DNS is host:port of a name whose every address (A and AAAA) is a replica's, e.g.
	// a Kubernetes headless Service selecting the replicas, with the admin port.
	DNS string `yaml:"dns"`
	// Interval is how often peers are polled; a poll not answered within it fails.
	Interval time.Duration `yaml:"interval"`
	// StaleAfter drops a peer's counts when it has not answered for this long (a
	// replica that stopped must not hold load on the workers forever).
	StaleAfter time.Duration `yaml:"stale_after"`
	// ResolveInterval is how often the DNS name is looked up again.
	ResolveInterval time.Duration `yaml:"resolve_interval"`
}

// DefaultConfig polls every 100 ms (replay: it recovers most of the Mooncake tail two
// replicas lose), drops a peer silent for 1 s and looks the DNS name up every 10 s.
func DefaultConfig() Config {
	return Config{Interval: 100 * time.Millisecond, StaleAfter: time.Second, ResolveInterval: 10 * time.Second}
}

// Enabled reports whether any peer source is configured.
func (c Config) Enabled() bool { return len(c.Addresses) > 0 || c.DNS != "" }

// String says where the peers are found and how often they are polled, for
// `extproc validate`.
func (c Config) String() string {
	if !c.Enabled() {
		return "no peers"
	}
	var from []string
	if len(c.Addresses) > 0 {
		from = append(from, fmt.Sprintf("%d addresses", len(c.Addresses)))
	}
	if c.DNS != "" {
		from = append(from, "DNS "+c.DNS)
	}
	return fmt.Sprintf("peers from %s every %s", strings.Join(from, " and "), c.Interval)
}

// Validate checks the section; errors name the key.
func (c Config) Validate() error {
	if len(c.Addresses) > MaxAddresses {
		return fmt.Errorf("peers.addresses: at most %d, got %d", MaxAddresses, len(c.Addresses))
	}
	for i, a := range c.Addresses {
		if err := checkHostPort(a); err != nil {
			return fmt.Errorf("peers.addresses[%d]: %w", i, err)
		}
	}
	if c.DNS != "" {
		if err := checkHostPort(c.DNS); err != nil {
			return fmt.Errorf("peers.dns: %w", err)
		}
	}
	switch {
	case c.Interval < 10*time.Millisecond || c.Interval > time.Minute:
		return fmt.Errorf("peers.interval: must be in [10ms, 1m], got %s", c.Interval)
	case c.StaleAfter < c.Interval || c.StaleAfter > time.Hour:
		return fmt.Errorf("peers.stale_after: must be in [peers.interval (%s), 1h], got %s", c.Interval, c.StaleAfter)
	case c.ResolveInterval < time.Second || c.ResolveInterval > time.Hour:
		return fmt.Errorf("peers.resolve_interval: must be in [1s, 1h], got %s", c.ResolveInterval)
	}
	return nil
}

func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("must be host:port, got %q", a)
	}
	return nil
}
