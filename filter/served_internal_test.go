package filter

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestServedByComparesAddressesNotSpellings pins whose response a reported served
// endpoint makes it: another spelling of the chosen worker's address is still the
// chosen worker, an empty report names no one else, and another endpoint is named in
// the canonical form worker addresses are written in.
func TestServedByComparesAddressesNotSpellings(t *testing.T) {
	tests := []struct {
		name      string
		served    *string // nil: not reported
		address   string
		elsewhere string // "": the chosen worker's
	}{
		{"not reported", nil, "10.0.0.1:8000", ""},
		{"empty", ptr(""), "10.0.0.1:8000", ""},
		{"the same", ptr("10.0.0.1:8000"), "10.0.0.1:8000", ""},
		{"another worker", ptr("10.0.0.2:8000"), "10.0.0.1:8000", "10.0.0.2:8000"},
		{"another port", ptr("10.0.0.1:8001"), "10.0.0.1:8000", "10.0.0.1:8001"},
		{"IPv6 in capitals", ptr("[FD00::1]:8000"), "[fd00::1]:8000", ""},
		{"IPv4-mapped", ptr("[::ffff:10.0.0.1]:8000"), "10.0.0.1:8000", ""},
		{"another worker, IPv4-mapped", ptr("[::ffff:10.0.0.2]:8000"), "10.0.0.1:8000", "10.0.0.2:8000"},
		{"another worker, IPv6 in capitals", ptr(" [FD00::2]:8000"), "[fd00::1]:8000", "[fd00::2]:8000"},
		{"not an address", ptr("somewhere"), "10.0.0.1:8000", "somewhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := &corev3.Metadata{}
			if tt.served != nil {
				fields, err := structpb.NewStruct(map[string]any{servedMDKey: *tt.served})
				if err != nil {
					t.Fatal(err)
				}
				md.FilterMetadata = map[string]*structpb.Struct{lbNamespace: fields}
			}
			got, elsewhere := servedElsewhere(md, tt.address)
			if got != tt.elsewhere || elsewhere != (tt.elsewhere != "") {
				t.Errorf("servedElsewhere(%v, %q) = %q, %v; want %q", tt.served, tt.address, got, elsewhere, tt.elsewhere)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestSubsetEntriesAreCanonical pins that a hint names a worker however its data plane
// spells the address: worker addresses are canonical, and the router compares strings.
func TestSubsetEntriesAreCanonical(t *testing.T) {
	tests := []struct {
		name string
		hint any
		want []string
	}{
		{"canonical already", "10.0.0.1:8000, [fd00::1]:8000", []string{"10.0.0.1:8000", "[fd00::1]:8000"}},
		{"IPv6 in capitals", []any{"[FD00::1]:8000"}, []string{"[fd00::1]:8000"}},
		{"IPv6 uncompressed", "[fd00:0:0:0:0:0:0:1]:8000", []string{"[fd00::1]:8000"}},
		{"IPv4-mapped", "[::ffff:10.0.0.1]:8000", []string{"10.0.0.1:8000"}},
		{"an IP without a port", "FD00::1, ::ffff:10.0.0.2", []string{"fd00::1", "10.0.0.2"}},
		{"a bracketed IP without a port", "[FD00::1]", []string{"fd00::1"}},
		{"a zoned IP with a port", "[FE80::1%eth0]:8000", []string{"[fe80::1%eth0]:8000"}},
		{"a zoned IP without a port, as the ip:port one", "FE80::1%eth0", []string{"fe80::1%eth0"}},
		{"not an address: kept as written", "pod-a:8000", []string{"pod-a:8000"}},
		{"empty entries dropped", " , ", []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := structpb.NewValue(tt.hint)
			if err != nil {
				t.Fatal(err)
			}
			if got := subsetEntries(v); !slices.Equal(got, tt.want) {
				t.Errorf("subsetEntries(%v) = %q, want %q", tt.hint, got, tt.want)
			}
		})
	}
}
