package offload

import (
	"slices"
	"strings"
)

// Matches reports whether a code object for target code runs on a GPU
// whose target, as ROCm reports it, is gpu: "gfx90a:sramecc+:xnack-"
// (the agent ISA name, with or without "amdgcn-amd-amdhsa--") or just
// "gfx90a" when the node's feature settings are unknown.
//
// The rules are those of the HIP runtime and ROCm loader:
//
//   - processor: the code's processor is the GPU's (clang
//     ClangOffloadBundler, "Compatibility Rules for Target ID"), or the
//     code is for a generic target whose family lists the GPU's processor
//     (AMDGPUUsage, "AMDGPU Generic Processors"; all members are supported
//     from generic version 1, see genericMembers);
//   - features: a feature the code leaves unset ("any") matches either
//     setting of the GPU; a feature set to + or - must equal the GPU's
//     setting (AMDGPUUsage, "Target Features" and "Target ID");
//   - a feature the code sets but the GPU's processor does not support
//     (xnack on gfx1030) never matches: the loader sees "unsupported", not
//     "off".
//
// certain is false when the answer depends on what gpu does not say: the
// code sets a feature that the GPU's processor supports but gpu carries no
// setting for it. ok is then true, meaning "runs if the node's setting is
// the code's". A gpu string that cannot be read gives false, false.
func Matches(code Target, gpu string) (ok bool, certain bool) {
	g, err := ParseTarget(gpu)
	if err != nil {
		return false, false
	}
	if code.Processor == "" {
		return false, true
	}
	if code.Processor != g.Processor && !slices.Contains(genericMembers[code.Processor], g.Processor) {
		return false, true
	}
	gf := featureMap(g.Features)
	certain = true
	for f, v := range featureMap(code.Features) {
		if v == "" {
			continue // any
		}
		if have, told := gf[f]; told {
			if have != v {
				return false, true
			}
			continue
		}
		sup, known := supports(g.Processor, f)
		if known && !sup {
			return false, true
		}
		// The node did not say how this feature is set.
		certain = false
	}
	return true, certain
}

// featureMap splits "sramecc+:xnack-" into {"sramecc": "+", "xnack": "-"}.
// Malformed items are kept with an empty setting, which Matches reads as
// "any".
func featureMap(s string) map[string]string {
	m := map[string]string{}
	if s == "" {
		return m
	}
	for _, f := range strings.Split(s, ":") {
		if n := len(f); n > 1 && (f[n-1] == '+' || f[n-1] == '-') {
			m[f[:n-1]] = f[n-1:]
		} else if f != "" {
			m[f] = ""
		}
	}
	return m
}
