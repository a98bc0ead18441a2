package peers

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/secret"
	"github.com/kvroute/kvroute/internal/tlsfiles"
)

// MaxAddresses bounds peers.addresses, the addresses taken from one DNS answer, and the
// watch streams a replica serves at once.
const MaxAddresses = 64

// Heartbeat is how often a replica sends its report to a watcher when nothing changed,
// so that a quiet replica is told from a gone one; peers.stale_after is at least two.
const Heartbeat = 250 * time.Millisecond

// Config is the peers section: where the other replicas' admin ports are, how soon this
// replica tells its watchers of a change, and when a silent peer stops counting. With
// no addresses and no DNS name this replica watches no one (it still serves its own
// report).
type Config struct {
	// Addresses are other replicas' admin addresses (host:port). This replica's own
	// address may be listed too: it is recognised by its id and skipped, so every
	// replica can share one list.
	Addresses []string `yaml:"addresses"`
	// DNS is host:port of a name whose every address (A and AAAA) is a replica's, e.g.
	// a Kubernetes headless Service selecting the replicas, with the admin port.
	DNS string `yaml:"dns"`
	// Interval is how often this replica looks for changes of its own bookings to send
	// to the replicas watching it: changes within it go out in one report. Booked load
	// matters while a request waits for its first token, often tens of milliseconds,
	// so it must be short.
	Interval time.Duration `yaml:"interval"`
	// StaleAfter drops a peer's counts when it has sent nothing (not even a heartbeat)
	// for this long: a replica that stopped must not hold load on the workers.
	StaleAfter time.Duration `yaml:"stale_after"`
	// ResolveInterval is how often the DNS name is looked up again.
	ResolveInterval time.Duration `yaml:"resolve_interval"`
	// ShareBlocks sends this replica's decisions' blocks to the replicas watching it,
	// and stores theirs in its index ([Record]): without KV events, a replica's index
	// otherwise knows only the prompts it placed itself.
	ShareBlocks bool `yaml:"share_blocks"`
	// TokenFile holds a secret every replica shares (read at start). With it, a
	// replica serves its report only to requests bearing the secret, and sends it to
	// its peers: what a peer reports moves routing, so only replicas may report.
	TokenFile string `yaml:"token_file"`
	// TLS watches the other replicas' admin ports over TLS (they serve it with
	// admin_tls): the token and the reports then cross the network encrypted, and
	// with a client certificate only replicas holding one are served (mTLS).
	TLS TLSConfig `yaml:"tls"`
}

// TLSConfig is peers.tls: how this replica checks the other replicas' admin
// certificates and which certificate it presents to them. The zero value watches in
// plain HTTP. The files are read again when they change (a rotated certificate is
// used from the next connection on).
type TLSConfig struct {
	// CAFile holds the PEM CAs that sign the replicas' admin certificates; empty trusts
	// the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are this replica's client certificate and key, for peers
	// whose admin_tls.client_ca_file asks for one; both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the peers' certificates must carry, checked in place of
	// the address dialled: replicas found through DNS are dialled by IP address, which
	// pod certificates seldom name. Empty checks the address's host.
	ServerName string `yaml:"server_name"`
}

// Enabled reports whether peers.tls is configured.
func (c TLSConfig) Enabled() bool { return c != TLSConfig{} }

// Validate checks that the files load; errors name the key.
func (c TLSConfig) Validate() error {
	if !c.Enabled() {
		return nil
	}
	_, err := c.build()
	return err
}

// paths are the files whose change makes the config built again.
func (c TLSConfig) paths() []string { return []string{c.CAFile, c.CertFile, c.KeyFile} }

// build makes the client config from the files. Reports are HTTP/1.1 streams.
func (c TLSConfig) build() (*tls.Config, error) {
	out := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}, ServerName: c.ServerName}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		return nil, errors.New("peers.tls.key_file: required with peers.tls.cert_file")
	case c.CertFile == "" && c.KeyFile != "":
		return nil, errors.New("peers.tls.cert_file: required with peers.tls.key_file")
	case c.CertFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("peers.tls.cert_file/peers.tls.key_file: %w", err)
		}
		out.Certificates = []tls.Certificate{cert}
	}
	if c.CAFile != "" {
		pool, err := tlsfiles.CertPool(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("peers.tls.ca_file: %w", err)
		}
		out.RootCAs = pool
	}
	return out, nil
}

// minTokenBytes is the shortest secret peers.token_file may hold: a guessable one
// guards nothing.
const minTokenBytes = 16

// Token reads the shared secret from TokenFile (secret.ReadFile: its content without
// surrounding whitespace, at most 4 KiB) and requires 16 printable ASCII characters or
// more, without spaces. Empty without a TokenFile. Errors name the key.
func (c Config) Token() (string, error) {
	if c.TokenFile == "" {
		return "", nil
	}
	token, err := secret.ReadFile(c.TokenFile)
	if err != nil {
		return "", fmt.Errorf("peers.token_file: %w", err)
	}
	if len(token) < minTokenBytes {
		return "", fmt.Errorf("peers.token_file: the secret must have %d characters or more, %s has %d", minTokenBytes, c.TokenFile, len(token))
	}
	for _, r := range token {
		if r < '!' || r > '~' {
			return "", fmt.Errorf("peers.token_file: the secret must be printable ASCII without spaces (%s)", c.TokenFile)
		}
	}
	return token, nil
}

// DefaultConfig sends changes within 10 ms, drops a peer silent for 1 s and looks the
// DNS name up every 10 s. Replay (two replicas, docs/BENCHMARKS.md "Several replicas and
// stale signals"): an exchange every 10 ms brings the shared-prefix TTFT p95 within
// 3 ms of one shared ledger's, where 100 ms recovers half of the gap or none; 5 ms
// gains under 1.5 ms more for twice the reports.
func DefaultConfig() Config {
	return Config{Interval: 10 * time.Millisecond, StaleAfter: time.Second, ResolveInterval: 10 * time.Second, ShareBlocks: true}
}

// Enabled reports whether any peer source is configured.
func (c Config) Enabled() bool { return len(c.Addresses) > 0 || c.DNS != "" }

// String says where the peers are found and how soon changes go out, for
// `extproc validate`.
func (c Config) String() string {
	if !c.Enabled() {
		if c.TokenFile != "" {
			return "no peers, own report guarded by a token from " + c.TokenFile
		}
		return "no peers"
	}
	var from []string
	if len(c.Addresses) > 0 {
		from = append(from, fmt.Sprintf("%d addresses", len(c.Addresses)))
	}
	if c.DNS != "" {
		from = append(from, "DNS "+c.DNS)
	}
	auth := "no token"
	if c.TokenFile != "" {
		auth = "token from " + c.TokenFile
	}
	if c.TLS.Enabled() {
		auth += ", over TLS"
		if c.TLS.CertFile != "" {
			auth += " with a client certificate"
		}
	} else {
		auth += ", plain HTTP"
	}
	blocks := "decisions' blocks shared"
	if !c.ShareBlocks {
		blocks = "decisions' blocks not shared"
	}
	return fmt.Sprintf("peers from %s, changes sent within %s, %s, %s", strings.Join(from, " and "), c.Interval, blocks, auth)
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
	case c.Interval < time.Millisecond || c.Interval > Heartbeat:
		return fmt.Errorf("peers.interval: must be in [1ms, %s], got %s", Heartbeat, c.Interval)
	case c.StaleAfter < 2*Heartbeat || c.StaleAfter > time.Hour:
		return fmt.Errorf("peers.stale_after: must be in [%s, 1h] (two heartbeats at least), got %s", 2*Heartbeat, c.StaleAfter)
	case c.ResolveInterval < time.Second || c.ResolveInterval > time.Hour:
		return fmt.Errorf("peers.resolve_interval: must be in [1s, 1h], got %s", c.ResolveInterval)
	}
	return c.TLS.Validate()
}

// UnreachableWarning is a warning when peers are configured but adminAddress, where
// the other replicas read this one's load, listens on loopback only (admin_address's
// default) while some peer is elsewhere: they would watch it in vain, and their costs
// miss every request this replica books. loopback reports whether a host:port is on
// loopback (admin.IsLoopback). Empty when there is nothing to warn of.
func (c Config) UnreachableWarning(adminAddress string, loopback func(string) bool) string {
	if !c.Enabled() || !loopback(adminAddress) {
		return ""
	}
	remote := c.DNS != ""
	for _, a := range c.Addresses {
		remote = remote || !loopback(a)
	}
	if !remote {
		return ""
	}
	return "peers: admin_address listens on loopback only, so the other replicas cannot read this replica's load (GET " + Path + "); bind it to an address they reach"
}

// checkHostPort refuses an address a watch would not reach as written: no host:port,
// a port that is not a number in [1, 65535] (a URL takes no port name), or a host the
// URL would read differently ("user@host", "host/path").
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("must be host:port, got %q", a)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port must be 1 to 65535, got %q", port)
	}
	if u, err := url.Parse(watchURL("http", a)); err != nil || u.Host != a {
		return fmt.Errorf("host %q is not a host name or IP address", host)
	}
	return nil
}

// watchURL is where a peer at addr (host:port) streams its reports, over scheme (http
// or https). The host is escaped, so an IPv6 zone (fe80::1%eth0, as a DNS answer may
// give) reaches the dialer whole.
func watchURL(scheme, addr string) string {
	return (&url.URL{Scheme: scheme, Host: addr, Path: Path, RawQuery: "watch"}).String()
}
