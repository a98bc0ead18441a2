package envoytest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
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

// errMutation is a mutation Envoy rejects as a whole. Unlike a spurious message, it
// fails the request even when failing open: Filter::onReceiveMessage (ext_proc.cc) sends
// status_on_error for any error other than FailedPrecondition ("Any other error results
// in an immediate response with an error message. This could happen, for example, after
// a header mutation is rejected.").
var errMutation = errors.New("invalid mutation")

// mutationRules are the parts of Envoy's configuration applyHeaderMutation needs.
type mutationRules struct {
	// allowEnvoy is mutation_rules.allow_envoy.
	allowEnvoy bool
	// removeContentLength: the direction's body mode drops content-length
	// (ProcessorState::shouldRemoveContentLength, processor_state.h), and a content-length
	// the processor sets is skipped (MutationUtils::applyHeaderMutations,
	// remove_content_length).
	removeContentLength bool
}

// mutable reports whether ext_proc may change a header, and why not. Envoy's default
// HeaderMutationRules (source/extensions/filters/common/mutation_rules/mutation_rules.cc,
// Checker::isAllowed): host, :authority, :method and :scheme are never mutable by
// default, x-envoy-* only with allow_envoy, no pseudo-header (nor host) may be removed,
// and none appended to (op APPEND: the append flag on a header present).
func mutable(key string, allowEnvoy, removal, appending bool) (bool, string) {
	switch {
	case key == "host" || key == ":authority" || key == ":method" || key == ":scheme":
		return false, "system header"
	case removal && strings.HasPrefix(key, ":"):
		return false, "pseudo-header removal"
	case appending && strings.HasPrefix(key, ":"):
		return false, "append to a pseudo-header"
	case strings.HasPrefix(key, "x-envoy") && !allowEnvoy:
		return false, "x-envoy header without allow_envoy"
	}
	return true, ""
}

// validValue is Checker::isValidValue (mutation_rules.cc) for the headers ext_proc may
// set: a :status that is not a number of at least 200 is ignored.
func validValue(key, value string) bool {
	if key == ":status" {
		n, err := strconv.ParseUint(value, 10, 32)
		return err == nil && n >= 200
	}
	return true
}

// headerNameIsValid is Http::HeaderUtility::headerNameIsValid (header_utility.cc): a
// name of RFC 9110 token characters, upper case allowed; a pseudo-header's name after
// its ':' in HTTP/2's rules (nghttp2_check_header_name: lower case only, not empty).
// An empty name passes there; applyHeaderMutation refuses it on its own.
func headerNameIsValid(key string) bool {
	pseudo := strings.HasPrefix(key, ":")
	if pseudo {
		key = key[1:]
		if key == "" {
			return false
		}
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		case c >= 'A' && c <= 'Z' && !pseudo:
		default:
			return false
		}
	}
	return true
}

// headerValueIsValid is Http::HeaderUtility::headerValueIsValid (header_utility.cc,
// HeaderValidator::IsValidHeaderValue with obs-text allowed): no control character
// but horizontal tab, no DEL. A value with CR, LF or NUL is an error, not a header.
func headerValueIsValid(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// applyHeaderMutation applies a mutation as Envoy's MutationUtils::applyHeaderMutations
// (mutation_utils.cc) does: removals first, then sets, in order; a remove or set whose
// name or value has invalid characters, or a set with both value and raw_value, is an
// error (errMutation) that stops the mutation there; raw_value carries the value, a
// value-only header arrives empty; a header the rules do not allow is skipped silently
// (recorded in ignored), as is a content-length in a body mode that drops it. How a
// set combines with headers already there follows the newest rules, which older Envoys
// (that ignore append_action) agree with whenever the processor leaves append_action
// at its default: a non-default append_action is honoured (OVERWRITE_IF_EXISTS_OR_ADD
// replaces every existing value, ADD_IF_ABSENT and OVERWRITE_IF_EXISTS act only when
// absent/present); at the default (APPEND_IF_EXISTS_OR_ADD, enum 0) the deprecated
// `append` flag decides, false unless set, so the default overwrites.
func applyHeaderMutation(h headerMap, m *extprocv3.HeaderMutation, rules mutationRules, ignored *[]string) error {
	for _, key := range m.GetRemoveHeaders() {
		if !headerNameIsValid(key) {
			return fmt.Errorf("%w: invalid character in remove_headers %q", errMutation, key)
		}
		key = strings.ToLower(key)
		if ok, why := mutable(key, rules.allowEnvoy, true, false); !ok {
			*ignored = append(*ignored, fmt.Sprintf("remove %s: %s", key, why))
			continue
		}
		delete(h, key)
	}
	for _, opt := range m.GetSetHeaders() {
		hv := opt.GetHeader()
		if hv == nil {
			continue
		}
		key := strings.ToLower(hv.GetKey())
		if rules.removeContentLength && key == "content-length" {
			*ignored = append(*ignored, "set content-length: the body mode drops it")
			continue
		}
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return fmt.Errorf("%w: header %q sets both value and raw_value", errMutation, key)
		}
		value := string(hv.GetRawValue()) // value-only → empty header
		if key == "" {
			return fmt.Errorf("%w: empty header key", errMutation)
		}
		if !headerNameIsValid(hv.GetKey()) || !headerValueIsValid(value) {
			return fmt.Errorf("%w: invalid character in set_headers %q", errMutation, key)
		}
		_, present := h[key]
		action := opt.GetAppendAction()
		appending := action == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD && opt.GetAppend().GetValue() && present
		if ok, why := mutable(key, rules.allowEnvoy, false, appending); !ok {
			*ignored = append(*ignored, fmt.Sprintf("set %s: %s", key, why))
			continue
		}
		if !validValue(key, value) {
			*ignored = append(*ignored, fmt.Sprintf("set %s: invalid value %q", key, value))
			continue
		}
		switch action {
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
