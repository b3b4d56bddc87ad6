// Package offload lists the AMD GPU targets compiled into a file: the gfx
// processors (gfx90a, gfx942, gfx11-generic ...) and target features
// (sramecc, xnack) of the code objects that the HIP runtime can load from it.
//
// HIP binaries carry their device code in clang offload bundles, usually in
// an ELF section named .hip_fatbin. An uncompressed bundle is
//
//	"__CLANG_OFFLOAD_BUNDLE__"  24-byte magic
//	u64 number of entries
//	per entry: u64 offset (from the bundle's start), u64 size,
//	           u64 id length, id bytes (no NUL)
//	the entries' code objects
//
// where an entry id is "<kind>-<triple>[-<target id>]", for example
// "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-" (see clang's ClangOffloadBundler
// documentation, "Bundle Entry ID" and "Target ID"). ROCm 6 compresses
// bundles (clang-offload-bundler -compress): a compressed bundle is
//
//	"CCOB"  4-byte magic
//	u16 version (1, 2 or 3), u16 method (0 zlib, 1 zstd)
//	v1: u32 uncompressed size
//	v2: u32 total size (this header included), u32 uncompressed size
//	v3: u64 total size, u64 uncompressed size
//	u64 truncated MD5 hash of the uncompressed bundle
//	the compressed data of a whole uncompressed bundle
//
// (clang/lib/Driver/OffloadBundler.cpp, RawCompressedBundleHeader; method
// values are llvm::compression::Format). kiln decompresses only the start of
// a compressed bundle, enough for its header and ids, with a small fixed
// window.
//
// A file may also be an AMDGPU code object itself (ELF, e_machine
// EM_AMDGPU): its target comes from the ELF header's e_flags (see mach.go).
// ROCm libraries also ship code objects beside them in files whose names
// carry the target (TensileLibrary_gfx90a.co, gfx90a68.kdb): see
// TargetFromName.
//
// Everything is read as a stream with fixed buffers, so a 1 GB library costs
// the same memory as a small one.
package offload

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Target is one AMD GPU target: a processor and its target features.
type Target struct {
	// Kind is the bundle entry's offload kind ("hip", "hipv4", "openmp"),
	// "hsaco" for a file that is a code object itself, "name" for a target
	// read from a file name (TargetFromName), "" for a bare target id.
	Kind string `json:"kind,omitempty"`
	// Triple is the target triple, "amdgcn-amd-amdhsa".
	Triple string `json:"triple,omitempty"`
	// Processor is the gfx name: "gfx90a", "gfx9-generic".
	Processor string `json:"processor"`
	// Features are the target features set in the id after the processor,
	// in canonical (alphabetic) order: "sramecc+:xnack-"; "" when none is
	// set, which means each feature may have any value.
	Features string `json:"features,omitempty"`
}

// Name writes the target id: the processor, then ":" and the features if
// any: "gfx90a:sramecc+:xnack-".
func (t Target) Name() string {
	if t.Features == "" {
		return t.Processor
	}
	return t.Processor + ":" + t.Features
}

// String is Name.
func (t Target) String() string { return t.Name() }

// Offload kinds of bundle entries.
const (
	KindHost   = "host"
	KindHIP    = "hip"
	KindHIPv4  = "hipv4"
	KindOpenMP = "openmp"
	// KindCodeObject marks a target read from a file that is a code object.
	KindCodeObject = "hsaco"
	// KindName marks a target read from a file name.
	KindName = "name"
)

// TripleAMDHSA is the triple of code objects for the ROCm runtime.
const TripleAMDHSA = "amdgcn-amd-amdhsa"

var (
	errEmpty     = errors.New("empty target")
	errHost      = errors.New("a host bundle entry names no GPU target")
	errNotAMDGPU = errors.New("not an AMD GPU (amdgcn) target")
)

// ParseTarget reads a target id ("gfx90a", "gfx90a:xnack-",
// "gfx906+xnack" as code object V2/V3 bundles write it), a target id with
// its triple as rocminfo prints an ISA ("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"),
// or a whole bundle entry id ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
// "hip-amdgcn-amd-amdhsa-gfx906"). Features are returned in canonical
// order. Host entries and other triples than amdgcn are errors, as is
// anything that does not follow the syntax.
func ParseTarget(s string) (Target, error) {
	if s == "" {
		return Target{}, errEmpty
	}
	if len(s) > maxIDLen {
		return Target{}, fmt.Errorf("target %.40q...: longer than %d bytes", s, maxIDLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return Target{}, fmt.Errorf("target %q: byte 0x%02x is not printable ASCII", s, c)
		}
	}
	var t Target
	rest := s
	if !strings.HasPrefix(s, "gfx") {
		first, after, ok := strings.Cut(s, "-")
		if !ok {
			return Target{}, fmt.Errorf("target %q: not a gfx processor, triple or bundle entry id", s)
		}
		if !isArch(first) {
			// <kind>-<triple>[-<target id>]
			if !isWord(first) {
				return Target{}, fmt.Errorf("target %q: offload kind %q is not a word", s, first)
			}
			t.Kind = first
			rest = after
		}
		triple, id, err := splitTriple(rest)
		if err != nil {
			return Target{}, fmt.Errorf("target %q: %w", s, err)
		}
		t.Triple = triple
		if t.Kind == KindHost {
			return Target{}, errHost
		}
		arch, _, _ := strings.Cut(triple, "-")
		if arch != "amdgcn" {
			return Target{}, fmt.Errorf("target %q: %w", s, errNotAMDGPU)
		}
		if id == "" {
			return Target{}, fmt.Errorf("target %q: no processor after the triple", s)
		}
		rest = id
	}
	proc, feats, err := parseTargetID(rest)
	if err != nil {
		return Target{}, fmt.Errorf("target %q: %w", s, err)
	}
	t.Processor, t.Features = proc, feats
	return t, nil
}

// isArch reports whether w is the architecture field of a triple kiln
// knows, so that a string starting with it is a triple, not a bundle id.
func isArch(w string) bool {
	switch w {
	case "amdgcn", "r600", "x86_64", "i386", "i686", "aarch64", "arm", "powerpc64le", "ppc64le", "riscv64", "s390x", "nvptx", "nvptx64", "spirv", "spirv64":
		return true
	}
	return false
}

// isWord reports whether w is a non-empty run of lowercase letters and
// digits starting with a letter.
func isWord(w string) bool {
	if w == "" || w[0] < 'a' || w[0] > 'z' {
		return false
	}
	for i := 0; i < len(w); i++ {
		c := w[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// isTripleField reports whether w can be a field of a triple: letters,
// digits, '_' and '.'.
func isTripleField(w string) bool {
	if w == "" {
		return false
	}
	for i := 0; i < len(w); i++ {
		c := w[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// splitTriple splits "<arch>-<vendor>-<os>[-<env>][-<target id>]" into the
// triple and the target id. The bundler writes 4-field triples whose
// environment is often empty ("amdgcn-amd-amdhsa--gfx90a"); older bundles
// have 3-field ones ("amdgcn-amd-amdhsa-gfx906"). A field after the OS that
// starts with "gfx" is the target id.
func splitTriple(s string) (triple, id string, err error) {
	parts := strings.SplitN(s, "-", 4)
	if len(parts) < 3 {
		return "", "", fmt.Errorf("triple %q has fewer than 3 fields", s)
	}
	for _, p := range parts[:3] {
		if !isTripleField(p) {
			return "", "", fmt.Errorf("triple %q: field %q is not plausible", s, p)
		}
	}
	triple = strings.Join(parts[:3], "-")
	if len(parts) == 3 {
		return triple, "", nil
	}
	rest := parts[3]
	if strings.HasPrefix(rest, "gfx") {
		return triple, rest, nil
	}
	env, id, _ := strings.Cut(rest, "-")
	if env != "" && !isTripleField(env) {
		return "", "", fmt.Errorf("triple %q: environment %q is not plausible", s, env)
	}
	return triple, id, nil
}

// parseTargetID reads "<processor>(:<feature>(+|-))*" or the code object
// V2/V3 form "<processor>(+<feature>)*" and returns the processor and the
// features in canonical order.
func parseTargetID(s string) (proc, feats string, err error) {
	i := strings.IndexAny(s, ":+")
	proc = s
	if i >= 0 {
		proc = s[:i]
	}
	if !isProcessor(proc) {
		return "", "", fmt.Errorf("processor %q is not a gfx name", proc)
	}
	if i < 0 {
		return proc, "", nil
	}
	var list []string
	seen := map[string]bool{}
	add := func(name string, on byte) error {
		if !isWord(name) {
			return fmt.Errorf("feature %q is not a word", name)
		}
		if seen[name] {
			return fmt.Errorf("feature %q given twice", name)
		}
		seen[name] = true
		list = append(list, name+string(on))
		return nil
	}
	rest := s[i:]
	if rest[0] == '+' {
		// V2/V3 bundle ids: a feature is listed when on (or any).
		for _, f := range strings.Split(rest[1:], "+") {
			if err := add(f, '+'); err != nil {
				return "", "", err
			}
		}
	} else {
		for _, f := range strings.Split(rest[1:], ":") {
			if len(f) < 2 || (f[len(f)-1] != '+' && f[len(f)-1] != '-') {
				return "", "", fmt.Errorf("feature %q does not end in + or -", f)
			}
			if err := add(f[:len(f)-1], f[len(f)-1]); err != nil {
				return "", "", err
			}
		}
	}
	slices.Sort(list)
	return proc, strings.Join(list, ":"), nil
}

// isProcessor checks the syntax of a gfx processor name: "gfx", a digit,
// then lowercase letters, digits and inner dashes (generic targets:
// "gfx10-3-generic").
func isProcessor(p string) bool {
	if len(p) < 4 || len(p) > 32 || !strings.HasPrefix(p, "gfx") || p[3] < '0' || p[3] > '9' || p[len(p)-1] == '-' {
		return false
	}
	for i := 4; i < len(p); i++ {
		c := p[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && p[i-1] != '-':
		default:
			return false
		}
	}
	return true
}

// Result is what a file holds.
type Result struct {
	// Targets are sorted by Name and unique by Name; host entries are left
	// out.
	Targets []Target `json:"targets"`
	// Bundles counts the bundles read (compressed ones included).
	Bundles int `json:"bundles"`
	// Compressed counts the compressed bundles read.
	Compressed int `json:"compressed"`
	// CodeObject is true when the file itself is an AMDGPU code object.
	CodeObject bool `json:"code_object"`
	// Unreadable counts bundles found but not decodable: an unknown
	// compression method or version, a truncated or corrupt bundle.
	Unreadable int `json:"unreadable,omitempty"`
}

// Empty reports whether no GPU target was found.
func (r *Result) Empty() bool { return r == nil || len(r.Targets) == 0 }

// Names lists the targets' names in order.
func (r *Result) Names() []string {
	if r == nil {
		return nil
	}
	out := make([]string, len(r.Targets))
	for i, t := range r.Targets {
		out[i] = t.Name()
	}
	return out
}

// String summarises a result: "gfx90a:xnack- gfx942".
func (r *Result) String() string { return strings.Join(r.Names(), " ") }

// addTarget inserts t keeping Targets sorted and unique by Name; of two
// targets with one name the one with the smaller kind, then triple, stays,
// so the result does not depend on the order in which they were found.
func (r *Result) addTarget(t Target) {
	n := t.Name()
	i, found := slices.BinarySearchFunc(r.Targets, n, func(e Target, n string) int { return strings.Compare(e.Name(), n) })
	if found {
		e := r.Targets[i]
		if t.Kind < e.Kind || t.Kind == e.Kind && t.Triple < e.Triple {
			r.Targets[i] = t
		}
		return
	}
	r.Targets = slices.Insert(r.Targets, i, t)
}

// Merge adds what another file holds.
func (r *Result) Merge(o *Result) {
	if o == nil {
		return
	}
	for _, t := range o.Targets {
		r.addTarget(t)
	}
	r.Bundles += o.Bundles
	r.Compressed += o.Compressed
	r.CodeObject = r.CodeObject || o.CodeObject
	r.Unreadable += o.Unreadable
}
