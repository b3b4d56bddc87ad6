// Package fatbin lists the GPU code compiled into CUDA binaries: the SASS
// targets (sm_80, sm_90a ...) and the PTX (compute_86 ...) with the PTX ISA
// version it was written in, held in the fat binaries of an ELF file's
// .nv_fatbin section.
//
// A fat binary is a sequence of containers. A container has a 16-byte
// header (magic 0xBA55ED50, version 1, header size 16, then the size of what
// follows) and a run of entries. Each entry has its own header, read here
// as (little endian):
//
//	0  u16 kind: 1 PTX, 2 ELF cubin (0x10 also a cubin, 0x40 skipped)
//	4  u32 size of this header (64; 80, 104 or 112 in CUDA 12.8 and later)
//	8  u64 padded size of the payload that follows the header
//	16 u32 stored (possibly compressed) payload size
//	24 u16 minor, 26 u16 major: for PTX the PTX ISA version (".version 9.1"),
//	   for a cubin its code version
//	28 u32 architecture (86 for sm_86 / compute_86)
//	40 u64 flags: 0x1 64-bit, 0x10 Linux, 0x2000 compressed (CUDA 11 and
//	   12), 0x8000 zstd-compressed (CUDA 12.8 and later)
//	56 u64 uncompressed payload size, when compressed
//
// The layout was read off real binaries: CUDA 11.8 libraries from Debian's
// archive and llama.cpp's CUDA 13.1 backend, checked against cuobjdump and
// against the PTX text itself (its ".version" and ".target" lines).
//
// The header does not say plainly whether a cubin or a PTX is
// architecture-specific (sm_90a) or family-specific (sm_100f), so for code
// of architecture 9.0 and later kiln reads the payload of one entry per
// distinct header: the PTX ".target" line, or the cubin's recorded ptxas
// options ("-arch sm_120a"), and its ELF flags. Payloads are otherwise
// skipped, so a 1 GB library is read as a stream with a small buffer.
package fatbin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Magic opens every fat binary container (little endian).
const Magic = 0xBA55ED50

// Entry kinds.
const (
	KindPTX  = 1
	KindELF  = 2
	KindELF2 = 0x10 // a second cubin kind some toolkits write
)

// Entry flags kiln reads.
const (
	FlagCompressed = 0x2000
	FlagZstd       = 0x8000
)

// Code kinds.
const (
	SASS = "sass"
	PTX  = "ptx"
)

// Variants of a target. VariantUnknown marks code of architecture 9.0 or
// later whose variant kiln could not read (its payload is compressed in a
// way kiln does not decode, or it names no target).
const (
	VariantPlain    = ""
	VariantArch     = "a"
	VariantFamily   = "f"
	VariantUnknown  = "?"
	firstVariantArc = 90 // sm_90a is the first architecture-specific target
)

const (
	containerHeaderSize = 16
	// minEntryHeader is the shortest entry header kiln reads (up to the
	// architecture field); real ones are 64 to 112 bytes.
	minEntryHeader = 32
	maxEntryHeader = 4096
)

// Code is one kind of GPU code a binary holds.
type Code struct {
	// Kind is SASS or PTX.
	Kind string `json:"kind"`
	// Arch is the target as a number: 80 for sm_80 / compute_80.
	Arch int `json:"arch"`
	// Variant is "", "a" (architecture-specific), "f" (family-specific)
	// or "?" (not readable).
	Variant string `json:"variant,omitempty"`
	// ISA is the PTX ISA version of PTX code ("8.5"); "" for SASS.
	ISA string `json:"isa,omitempty"`
	// Compressed is true when at least one such entry had a compressed payload.
	Compressed bool `json:"compressed,omitempty"`
}

// Name writes the target the way nvcc and cuobjdump name it: "sm_90a",
// "compute_86".
func (c Code) Name() string {
	v := c.Variant
	if v == VariantUnknown {
		v = ""
	}
	if c.Kind == PTX {
		return fmt.Sprintf("compute_%d%s", c.Arch, v)
	}
	return fmt.Sprintf("sm_%d%s", c.Arch, v)
}

// String is Name with the PTX ISA: "compute_86 (PTX ISA 7.8)", and "sm_90?"
// for a variant kiln could not read.
func (c Code) String() string {
	s := c.Name()
	if c.Variant == VariantUnknown {
		s += "?"
	}
	if c.ISA != "" {
		s += " (PTX ISA " + c.ISA + ")"
	}
	return s
}

func (c Code) less(o Code) bool {
	if c.Kind != o.Kind {
		return c.Kind == SASS
	}
	if c.Arch != o.Arch {
		return c.Arch < o.Arch
	}
	if c.Variant != o.Variant {
		return c.Variant < o.Variant
	}
	return CompareISA(c.ISA, o.ISA) < 0
}

func (c Code) same(o Code) bool {
	return c.Kind == o.Kind && c.Arch == o.Arch && c.Variant == o.Variant && c.ISA == o.ISA
}

// Entry is one code object in a container, as its header describes it.
type Entry struct {
	// Kind is KindPTX or KindELF (KindELF2 is reported as KindELF).
	Kind int
	// Arch is the target as a number: 80 for sm_80 / compute_80.
	Arch int
	// Major and Minor are the header's version: the PTX ISA for PTX.
	Major, Minor int
	// Flags are the header's flags.
	Flags uint64
	// Variant is what the payload says ("" when not read).
	Variant string
}

// Compressed reports whether the payload is compressed.
func (e Entry) Compressed() bool { return e.Flags&(FlagCompressed|FlagZstd) != 0 }

// Code is the entry as a Code.
func (e Entry) Code() Code {
	c := Code{Arch: e.Arch, Variant: e.Variant, Compressed: e.Compressed()}
	if e.Kind == KindPTX {
		c.Kind = PTX
		c.ISA = fmt.Sprintf("%d.%d", e.Major, e.Minor)
	} else {
		c.Kind = SASS
	}
	return c
}

// Result is what one binary holds.
type Result struct {
	// Codes are the distinct codes, SASS first, then PTX, each by
	// architecture.
	Codes []Code `json:"codes,omitempty"`
	// Containers and Entries count what was read.
	Containers int `json:"containers"`
	Entries    int `json:"entries"`
}

// Empty reports whether no GPU code was found.
func (r *Result) Empty() bool { return r == nil || len(r.Codes) == 0 }

// SASS returns the machine code targets.
func (r *Result) SASS() []Code { return r.kind(SASS) }

// PTX returns the PTX targets.
func (r *Result) PTX() []Code { return r.kind(PTX) }

func (r *Result) kind(k string) []Code {
	if r == nil {
		return nil
	}
	var out []Code
	for _, c := range r.Codes {
		if c.Kind == k {
			out = append(out, c)
		}
	}
	return out
}

// add records an entry.
func (r *Result) add(e Entry) {
	r.Entries++
	if e.Arch <= 0 || e.Kind != KindPTX && e.Kind != KindELF {
		return
	}
	r.insert(e.Code())
}

func (r *Result) insert(c Code) {
	i := sort.Search(len(r.Codes), func(i int) bool { return !r.Codes[i].less(c) })
	if i < len(r.Codes) && r.Codes[i].same(c) {
		r.Codes[i].Compressed = r.Codes[i].Compressed || c.Compressed
		return
	}
	r.Codes = append(r.Codes, Code{})
	copy(r.Codes[i+1:], r.Codes[i:])
	r.Codes[i] = c
}

// Merge adds what another binary holds.
func (r *Result) Merge(o *Result) {
	if o == nil {
		return
	}
	for _, c := range o.Codes {
		r.insert(c)
	}
	r.Containers += o.Containers
	r.Entries += o.Entries
}

// String summarises a result: "sm_80 sm_86 compute_86 (PTX ISA 7.8)".
func (r *Result) String() string {
	var parts []string
	for _, c := range r.Codes {
		parts = append(parts, c.String())
	}
	return strings.Join(parts, " ")
}

// CC writes an architecture number as a compute capability: 86 -> "8.6",
// 100 -> "10.0", 120 -> "12.0".
func CC(arch int) string { return fmt.Sprintf("%d.%d", arch/10, arch%10) }

// ParseTarget reads "sm_90a", "compute_86", "sm_100f" (also "90a") into a
// Code without ISA.
func ParseTarget(s string) (Code, error) {
	c := Code{Kind: SASS}
	rest := strings.TrimSpace(s)
	switch {
	case strings.HasPrefix(rest, "sm_"):
		rest = rest[3:]
	case strings.HasPrefix(rest, "compute_"):
		c.Kind, rest = PTX, rest[8:]
	}
	switch {
	case strings.HasSuffix(rest, "a"):
		c.Variant, rest = VariantArch, rest[:len(rest)-1]
	case strings.HasSuffix(rest, "f"):
		c.Variant, rest = VariantFamily, rest[:len(rest)-1]
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 10 || n > 999 || len(rest) > 3 {
		return Code{}, fmt.Errorf("%q is not a CUDA target (like sm_86, sm_90a or compute_80)", s)
	}
	c.Arch = n
	return c, nil
}

// CompareISA compares PTX ISA versions ("8.5" < "8.10" would not exist,
// but the fields are compared as numbers). Empty sorts first.
func CompareISA(a, b string) int {
	am, an := splitISA(a)
	bm, bn := splitISA(b)
	switch {
	case am != bm:
		return cmpInt(am, bm)
	default:
		return cmpInt(an, bn)
	}
}

func splitISA(v string) (int, int) {
	maj, min, _ := strings.Cut(v, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if err1 != nil {
		return -1, -1
	}
	if err2 != nil {
		b = 0
	}
	return a, b
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var errNotContainer = errors.New("not a fat binary container")

// parseContainerHeader checks a container header and returns the size of
// the entries that follow it.
func parseContainerHeader(b []byte) (uint64, error) {
	if len(b) < containerHeaderSize {
		return 0, errNotContainer
	}
	if binary.LittleEndian.Uint32(b) != Magic ||
		binary.LittleEndian.Uint16(b[4:]) != 1 ||
		binary.LittleEndian.Uint16(b[6:]) != containerHeaderSize {
		return 0, errNotContainer
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// entryHeader is a parsed entry header.
type entryHeader struct {
	Entry
	hdr     uint32 // size of the header
	payload uint64 // padded payload size
	stored  uint32 // stored payload size (0: unknown, use payload)
	key     string // what identifies entries that share a variant
}

// parseEntryHeader reads an entry header: its kind, architecture, version,
// flags, the size of the header itself and of the padded payload after it.
func parseEntryHeader(b []byte) (entryHeader, error) {
	if len(b) < minEntryHeader {
		return entryHeader{}, fmt.Errorf("fat binary entry: %d bytes is shorter than an entry header", len(b))
	}
	var h entryHeader
	h.Kind = int(binary.LittleEndian.Uint16(b))
	h.hdr = binary.LittleEndian.Uint32(b[4:])
	h.payload = binary.LittleEndian.Uint64(b[8:])
	h.stored = binary.LittleEndian.Uint32(b[16:])
	h.Minor = int(binary.LittleEndian.Uint16(b[24:]))
	h.Major = int(binary.LittleEndian.Uint16(b[26:]))
	arch := binary.LittleEndian.Uint32(b[28:])
	if len(b) >= 48 {
		h.Flags = binary.LittleEndian.Uint64(b[40:])
	}
	if h.hdr < minEntryHeader || h.hdr > maxEntryHeader {
		return entryHeader{}, fmt.Errorf("fat binary entry: header size %d is not plausible", h.hdr)
	}
	if h.Kind != KindPTX && h.Kind != KindELF && h.Kind != KindELF2 {
		// Other kinds exist (0x40); they are skipped, not an error.
		return h, nil
	}
	if arch > 10000 {
		return entryHeader{}, fmt.Errorf("fat binary entry: architecture %d is not plausible", arch)
	}
	if h.Kind == KindELF2 {
		h.Kind = KindELF
	}
	h.Arch = int(arch)
	// Entries whose headers agree but for sizes and names share a variant.
	var k strings.Builder
	fmt.Fprintf(&k, "%d/%d/%d.%d/%x/", h.Kind, h.Arch, h.Major, h.Minor, h.Flags)
	if n := min(int(h.hdr), len(b)); n > 64 {
		k.Write(b[64:n])
	}
	h.key = k.String()
	return h, nil
}
