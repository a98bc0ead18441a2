package envoytest

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerMap is one direction's headers as Envoy holds them: lower-case keys, including
// pseudo-headers (":method", ":path", ":status", …).
type headerMap map[string][]string

func (h headerMap) first(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (h headerMap) proto() *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for k, vs := range h {
		for _, v := range vs {
			// Envoy sends raw_value (ENVOY.md §3).
			out.Headers = append(out.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
		}
	}
	return out
}

func fromHTTP(h http.Header) headerMap {
	out := headerMap{}
	for k, vs := range h {
		out[strings.ToLower(k)] = append([]string(nil), vs...)
	}
	return out
}

// errMutation is a header mutation Envoy rejects as a whole (a processor failure).
var errMutation = errors.New("invalid header mutation")

// mutable reports whether ext_proc may change a header, and why not. Envoy's default
// HeaderMutationRules (source/extensions/filters/common/mutation_rules/mutation_rules.cc,
// Checker::check): host, :authority, :method and :scheme are never mutable by default,
// and x-envoy-* only with allow_envoy.
func mutable(key string, allowEnvoy, removal bool) (bool, string) {
	switch {
	case key == "host" || key == ":authority" || key == ":method" || key == ":scheme":
		return false, "system header"
	case strings.HasPrefix(key, "x-envoy") && !allowEnvoy:
		return false, "x-envoy header without allow_envoy"
	case removal && strings.HasPrefix(key, ":"):
		return false, "pseudo-header removal"
	}
	return true, ""
}

// applyHeaderMutation applies a mutation as Envoy's MutationUtils::applyHeaderMutations
// (mutation_utils.cc) does: removals first; raw_value carries the value, a value-only
// header arrives empty, both set is an error; a disallowed header is skipped silently
// (recorded in ignored). How a set combines with headers already there follows the
// newest rules, which older Envoys (that ignore append_action) agree with whenever the
// processor leaves append_action at its default: a non-default append_action is
// honoured (OVERWRITE_IF_EXISTS_OR_ADD replaces every existing value, ADD_IF_ABSENT and
// OVERWRITE_IF_EXISTS act only when absent/present); at the default
// (APPEND_IF_EXISTS_OR_ADD, enum 0) the deprecated `append` flag decides, false unless
// set, so the default overwrites.
func applyHeaderMutation(h headerMap, m *extprocv3.HeaderMutation, allowEnvoy bool, ignored *[]string) error {
	for _, key := range m.GetRemoveHeaders() {
		key = strings.ToLower(key)
		if ok, why := mutable(key, allowEnvoy, true); !ok {
			*ignored = append(*ignored, fmt.Sprintf("remove %s: %s", key, why))
			continue
		}
		delete(h, key)
	}
	for _, opt := range m.GetSetHeaders() {
		hv := opt.GetHeader()
		key := strings.ToLower(hv.GetKey())
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return fmt.Errorf("%w: header %q sets both value and raw_value", errMutation, key)
		}
		if key == "" {
			return fmt.Errorf("%w: empty header key", errMutation)
		}
		if ok, why := mutable(key, allowEnvoy, false); !ok {
			*ignored = append(*ignored, fmt.Sprintf("set %s: %s", key, why))
			continue
		}
		value := string(hv.GetRawValue()) // value-only → empty header
		_, present := h[key]
		switch opt.GetAppendAction() {
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			h[key] = []string{value}
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !present {
				h[key] = []string{value}
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if present {
				h[key] = []string{value}
			}
		default: // APPEND_IF_EXISTS_OR_ADD, the default: the `append` flag decides
			if opt.GetAppend().GetValue() {
				h[key] = append(h[key], value)
			} else {
				h[key] = []string{value}
			}
		}
	}
	return nil
}

// keepNamespaces filters reply metadata to metadata_options.receiving_namespaces
// (ext_proc.cc, Filter::setDynamicMetadata): other namespaces are dropped.
func keepNamespaces(into map[string]*structpb.Struct, md *structpb.Struct, receiving []string) {
	for ns, v := range md.GetFields() {
		for _, allowed := range receiving {
			if ns == allowed && v.GetStructValue() != nil {
				into[ns] = v.GetStructValue()
			}
		}
	}
}
