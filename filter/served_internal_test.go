package filter

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestServedByComparesAddressesNotSpellings pins whose response a reported served
// endpoint makes it: another spelling of the chosen worker's address is still the
// chosen worker, and an empty report names no one else.
func TestServedByComparesAddressesNotSpellings(t *testing.T) {
	tests := []struct {
		name     string
		served   *string // nil: not reported
		address  string
		isChosen bool
	}{
		{"not reported", nil, "10.0.0.1:8000", true},
		{"empty", ptr(""), "10.0.0.1:8000", true},
		{"the same", ptr("10.0.0.1:8000"), "10.0.0.1:8000", true},
		{"another worker", ptr("10.0.0.2:8000"), "10.0.0.1:8000", false},
		{"another port", ptr("10.0.0.1:8001"), "10.0.0.1:8000", false},
		{"IPv6 in capitals", ptr("[FD00::1]:8000"), "[fd00::1]:8000", true},
		{"IPv4-mapped", ptr("[::ffff:10.0.0.1]:8000"), "10.0.0.1:8000", true},
		{"not an address", ptr("somewhere"), "10.0.0.1:8000", false},
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
			if got := servedBy(md, tt.address); got != tt.isChosen {
				t.Errorf("servedBy(%v, %q) = %v, want %v", tt.served, tt.address, got, tt.isChosen)
			}
		})
	}
}

func ptr(s string) *string { return &s }
