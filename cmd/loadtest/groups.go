package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A streamGroup is one key:streams pair of a flag that numbers the streams by group
// (-tenants: a tenant, keyed by its name; -samples-mix: a sample class, keyed by its
// requests' samples).
type streamGroup[K comparable] struct {
	key     K
	streams int
}

// parseGroups reads such a flag: comma-separated key:streams pairs, each key read by
// key (whose error names the key) and given once, each group at least one stream, at
// most most groups (units in errors). keyName names the key in errors. "" is no groups.
func parseGroups[K comparable](flag, keyName, units string, most int, s string, key func(string) (K, error)) ([]streamGroup[K], error) {
	if s == "" {
		return nil, nil
	}
	var out []streamGroup[K]
	for _, pair := range strings.Split(s, ",") {
		k, n, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not %s:streams", flag, pair, keyName)
		}
		parsed, err := key(k)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		streams, err := strconv.Atoi(n)
		switch {
		case err != nil || streams < 1:
			return nil, fmt.Errorf("%s: %s's streams must be a whole number ≥ 1, got %q", flag, k, n)
		case slices.ContainsFunc(out, func(g streamGroup[K]) bool { return g.key == parsed }):
			return nil, fmt.Errorf("%s: %q given twice", flag, k)
		case len(out) == most:
			return nil, fmt.Errorf("%s: at most %d %s", flag, most, units)
		}
		out = append(out, streamGroup[K]{key: parsed, streams: streams})
	}
	return out, nil
}

// groupStreams is the streams of every group together: -streams with the flag.
func groupStreams[K comparable](groups []streamGroup[K]) int {
	n := 0
	for _, g := range groups {
		n += g.streams
	}
	return n
}

// groupKeys gives each stream its group's key: streams are numbered in the flag's
// order, the first group's first (nil without groups).
func groupKeys[K comparable](groups []streamGroup[K]) []K {
	var out []K
	for _, g := range groups {
		for range g.streams {
			out = append(out, g.key)
		}
	}
	return out
}

// groupList is the flag as given: key:streams, comma-separated.
func groupList[K comparable](groups []streamGroup[K]) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = fmt.Sprintf("%v:%d", g.key, g.streams)
	}
	return strings.Join(parts, ",")
}
