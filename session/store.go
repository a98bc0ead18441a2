package session

import (
	"container/list"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Store maps sessions to the worker that served each one last. Build it with [New].
type Store struct {
	ttl time.Duration
	max int
	now func() time.Time
	key func(id string) uint64 // Key, or ResponseKey for a store of responses

	mu      sync.Mutex
	entries map[uint64]*list.Element // of *entry
	order   list.List                // most recently remembered first
}

type entry struct {
	key     uint64
	worker  string
	expires time.Time
}

// New returns an empty store. now is the clock for TTLs; nil means time.Now.
func New(cfg Config, now func() time.Time) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Store{ttl: cfg.TTL, max: cfg.MaxEntries, now: now, key: Key, entries: make(map[uint64]*list.Element)}, nil
}

// Key is the store's key of a session id: what other replicas are told instead of the
// id itself (package peers), which a client chose and may hold secrets.
func Key(id string) uint64 { return xxh3.HashString(id) }

// responseSeed makes ResponseKey's hashes a family of their own: a client's session id
// cannot be chosen to share a key with a response (it would need a preimage).
const responseSeed = 0x6b76726f75746572 // "kvrouter"

// ResponseKey is the key of a Responses API response id in a store of responses
// (NewResponses), and what other replicas are told: peers send both kinds as the same
// 64-bit field, and a replica that takes a response's key for a session's never finds
// it by a session header.
func ResponseKey(id string) uint64 { return xxh3.HashStringSeed(id, responseSeed) }

// sglangSessionSeed makes SGLangSessionKey's hashes a family of their own, apart from
// ResponseKey's in the same store: no client-chosen id of one kind can share a key
// with the other's (it would need a preimage).
const sglangSessionSeed = 0x73676c616e67736e // "sglangsn"

// SGLangSessionKey is the key of an SGLang session id in a store of responses (which
// also remembers the engine that opened each SGLang session), and what other replicas
// are told.
func SGLangSessionKey(id string) uint64 { return xxh3.HashStringSeed(id, sglangSessionSeed) }

// KeyOf is the key the store keeps id under: Key, or ResponseKey in a store of
// responses.
func (s *Store) KeyOf(id string) uint64 { return s.key(id) }

// SGLangSessionKeyOf is SGLangSessionKey, for a caller that holds the store behind an
// interface.
func (s *Store) SGLangSessionKeyOf(id string) uint64 { return SGLangSessionKey(id) }

// Lookup returns the worker that served the session last, unless the session is
// unknown or was idle for the TTL.
func (s *Store) Lookup(id string) (worker string, ok bool) { return s.LookupKey(s.key(id)) }

// LookupKey is Lookup of an entry known by its key (KeyOf, SGLangSessionKey).
func (s *Store) LookupKey(key uint64) (worker string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[key]
	if !ok {
		return "", false
	}
	e := el.Value.(*entry)
	if !s.now().Before(e.expires) {
		s.order.Remove(el)
		delete(s.entries, key)
		return "", false
	}
	return e.worker, true
}

// Remember records that worker served the session now. It forgets sessions idle for
// the TTL, then the least recently remembered ones past max_entries.
func (s *Store) Remember(id, worker string) { s.RememberKey(s.key(id), worker) }

// RememberKey is Remember of a session known by its Key: another replica's decision.
func (s *Store) RememberKey(key uint64, worker string) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.entries[key]; ok {
		e := el.Value.(*entry)
		e.worker, e.expires = worker, now.Add(s.ttl)
		s.order.MoveToFront(el)
	} else {
		s.entries[key] = s.order.PushFront(&entry{key: key, worker: worker, expires: now.Add(s.ttl)})
	}
	s.dropLocked(now)
}

// dropLocked forgets the sessions idle for the TTL, then the least recently
// remembered ones past max_entries. s.mu is held.
func (s *Store) dropLocked(now time.Time) {
	// The list is in order of last use, so expired sessions are at its back.
	for back := s.order.Back(); back != nil; back = s.order.Back() {
		e := back.Value.(*entry)
		if len(s.entries) <= s.max && now.Before(e.expires) {
			break
		}
		s.order.Remove(back)
		delete(s.entries, e.key)
	}
}

// ForgetWorker forgets the sessions whose last worker is worker (its address changed:
// another engine, which holds none of their KV, runs under its name; or it left the
// fleet). It returns how many it forgot. It reads every session: a fleet change, not a
// request, calls it.
func (s *Store) ForgetWorker(worker string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for el := s.order.Front(); el != nil; {
		next := el.Next()
		if e := el.Value.(*entry); e.worker == worker {
			s.order.Remove(el)
			delete(s.entries, e.key)
			n++
		}
		el = next
	}
	return n
}

// Len returns the sessions remembered and not idle for the TTL. It forgets the expired
// ones: the gauge that reads it is then true, and a replica whose traffic stopped
// frees them at its next scrape, not at its next request.
func (s *Store) Len() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(now)
	return len(s.entries)
}
