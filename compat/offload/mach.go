package offload

import (
	"fmt"
	"slices"
	"strings"
)

// ELF identification of AMDGPU code objects (LLVM AMDGPUUsage, "ELF Header",
// table "AMDGPU ELF Header Enumeration Values").
const (
	// EMAMDGPU is e_machine of every AMDGPU code object.
	EMAMDGPU = 224

	osABIAMDGPUHSA    = 64
	osABIAMDGPUPAL    = 65
	osABIAMDGPUMesa3D = 66

	// e_ident[EI_ABIVERSION] for ELFOSABI_AMDGPU_HSA: code object V2 is 0,
	// V3 1, V4 2, V5 3, V6 4.
	abiVersionV3 = 1
	abiVersionV4 = 2
	abiVersionV6 = 4
)

// e_flags fields (AMDGPUUsage, "AMDGPU ELF Header e_flags for Code Object
// V3", "... V4 and V5", "... V6 and After").
const (
	efMach = 0x0ff

	efXnackV3   = 0x100
	efSrameccV3 = 0x200

	efXnackV4            = 0x300
	efXnackUnsupportedV4 = 0x000
	efXnackAnyV4         = 0x100
	efXnackOffV4         = 0x200
	efXnackOnV4          = 0x300

	efSrameccV4            = 0xc00
	efSrameccUnsupportedV4 = 0x000
	efSrameccAnyV4         = 0x400
	efSrameccOffV4         = 0x800
	efSrameccOnV4          = 0xc00

	efGenericVersion      = 0xff000000
	efGenericVersionShift = 24
)

// mach is one EF_AMDGPU_MACH value: its processor and whether the
// processor supports the xnack and sramecc target features (AMDGPUUsage,
// table "AMDGPU Processors", column "Target Features Supported").
type mach struct {
	value          uint8
	name           string
	xnack, sramecc bool
}

// machs is the EF_AMDGPU_MACH table for amdgcn (GFX6 onwards) from LLVM's
// AMDGPUUsage, section "ELF Code Object" / "Header", table "AMDGPU
// EF_AMDGPU_MACH Values" (llvm/docs/AMDGPUUsage.rst as of LLVM 20, which
// matches llvm/include/llvm/BinaryFormat/ELF.h). Values the table marks
// reserved, and values assigned after it (0x049 was first given to gfx1210
// and later to gfx1250), are left out on purpose: a code object with one of
// them is reported as "unknown-mach-0xNN" rather than named by a guess.
// gfx940 and gfx941 were dropped from later LLVM releases, but ROCm 5.x/6.x
// shipped code for them, so they stay.
var machs = []mach{
	{0x020, "gfx600", false, false},
	{0x021, "gfx601", false, false},
	{0x03a, "gfx602", false, false},
	{0x022, "gfx700", false, false},
	{0x023, "gfx701", false, false},
	{0x024, "gfx702", false, false},
	{0x025, "gfx703", false, false},
	{0x026, "gfx704", false, false},
	{0x03b, "gfx705", false, false},
	{0x028, "gfx801", true, false},
	{0x029, "gfx802", false, false},
	{0x02a, "gfx803", false, false},
	{0x03c, "gfx805", false, false},
	{0x02b, "gfx810", true, false},
	{0x02c, "gfx900", true, false},
	{0x02d, "gfx902", true, false},
	{0x02e, "gfx904", true, false},
	{0x02f, "gfx906", true, true},
	{0x030, "gfx908", true, true},
	{0x031, "gfx909", true, false},
	{0x03f, "gfx90a", true, true},
	{0x032, "gfx90c", true, false},
	{0x040, "gfx940", true, true},
	{0x04b, "gfx941", true, true},
	{0x04c, "gfx942", true, true},
	{0x04f, "gfx950", true, true},
	{0x033, "gfx1010", true, false},
	{0x034, "gfx1011", true, false},
	{0x035, "gfx1012", true, false},
	{0x042, "gfx1013", true, false},
	{0x036, "gfx1030", false, false},
	{0x037, "gfx1031", false, false},
	{0x038, "gfx1032", false, false},
	{0x039, "gfx1033", false, false},
	{0x03e, "gfx1034", false, false},
	{0x03d, "gfx1035", false, false},
	{0x045, "gfx1036", false, false},
	{0x041, "gfx1100", false, false},
	{0x046, "gfx1101", false, false},
	{0x047, "gfx1102", false, false},
	{0x044, "gfx1103", false, false},
	{0x043, "gfx1150", false, false},
	{0x04a, "gfx1151", false, false},
	{0x055, "gfx1152", false, false},
	{0x058, "gfx1153", false, false},
	{0x048, "gfx1200", false, false},
	{0x04e, "gfx1201", false, false},
	// Generic targets (code object V6 and above).
	{0x051, "gfx9-generic", true, false},
	{0x05f, "gfx9-4-generic", true, true},
	{0x052, "gfx10-1-generic", true, false},
	{0x053, "gfx10-3-generic", false, false},
	{0x054, "gfx11-generic", false, false},
	{0x059, "gfx12-generic", false, false},
}

// genericMembers lists the processors each generic target runs on, from
// AMDGPUUsage, "Processors", table "AMDGPU Generic Processors" (column
// "Supported Processors", LLVM 20). The HIP runtime's own map (hip-tests,
// getGenericTarget) lists the same processors. Every member listed there was
// supported from generic version 1, so any generic code object version runs
// on all of them.
var genericMembers = map[string][]string{
	"gfx9-generic":    {"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"},
	"gfx9-4-generic":  {"gfx940", "gfx941", "gfx942", "gfx950"},
	"gfx10-1-generic": {"gfx1010", "gfx1011", "gfx1012", "gfx1013"},
	"gfx10-3-generic": {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"},
	"gfx11-generic":   {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"},
	"gfx12-generic":   {"gfx1200", "gfx1201"},
}

var (
	machByValue [256]*mach
	machByName  = map[string]*mach{}
	// knownNames are the table's processor names, longest first, for
	// TargetFromName's longest-prefix match.
	knownNames []string
)

func init() {
	for i := range machs {
		m := &machs[i]
		machByValue[m.value] = m
		machByName[m.name] = m
		knownNames = append(knownNames, m.name)
	}
	slices.SortFunc(knownNames, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
}

// ProcessorName returns the processor of an EF_AMDGPU_MACH value, or
// "unknown-mach-0xNN" for a value the table does not name.
func ProcessorName(machValue uint8) string {
	if m := machByValue[machValue]; m != nil {
		return m.name
	}
	return fmt.Sprintf("unknown-mach-0x%02x", machValue)
}

// supports reports whether processor p supports feature f; known is false
// when kiln's table does not have p or f is not xnack or sramecc.
func supports(p, f string) (ok, known bool) {
	m := machByName[p]
	if m == nil {
		return false, false
	}
	switch f {
	case "xnack":
		return m.xnack, true
	case "sramecc":
		return m.sramecc, true
	}
	return false, false
}

// TargetFromFlags decodes the target of an AMDGPU code object from its ELF
// header: e_ident[EI_CLASS] (class, 1 ELF32 or 2 ELF64),
// e_ident[EI_OSABI], e_ident[EI_ABIVERSION] and e_flags. genericVersion
// is the generic code object version of code object V6 and above (0 for
// non-generic targets and older code objects).
//
// Feature settings follow the ROCm loader (ROCr, AmdHsaCode::GetIsa):
// for code object V3 a feature is on when its bit is set and off otherwise
// (when the processor supports it); from V4 each feature has a 2-bit field
// meaning unsupported, any, off or on, and only off and on are written in
// Features. Code object V2 keeps the processor in a note record, which
// kiln does not read: its e_flags are read as V3's and may name no known
// processor (ROCm 6 does not load V2 anyway). For other OS ABIs than amdhsa
// no features are reported.
func TargetFromFlags(class, osABI, abiVersion uint8, flags uint32) (t Target, genericVersion int) {
	mv := uint8(flags & efMach)
	arch := "amdgcn"
	if class == 1 {
		arch = "r600"
	}
	osName := ""
	switch osABI {
	case osABIAMDGPUHSA:
		osName = "amdhsa"
	case osABIAMDGPUPAL:
		osName = "amdpal"
	case osABIAMDGPUMesa3D:
		osName = "mesa3d"
	}
	t = Target{Kind: KindCodeObject, Triple: arch + "-amd-" + osName, Processor: ProcessorName(mv)}
	if class == 1 {
		// r600 processors are not in the table.
		t.Processor = fmt.Sprintf("unknown-mach-0x%02x", mv)
		return t, 0
	}
	if osABI != osABIAMDGPUHSA {
		return t, 0
	}
	m := machByValue[mv]
	var feats []string
	if abiVersion < abiVersionV4 {
		if flags&efSrameccV3 != 0 {
			feats = append(feats, "sramecc+")
		} else if m != nil && m.sramecc {
			feats = append(feats, "sramecc-")
		}
		if flags&efXnackV3 != 0 {
			feats = append(feats, "xnack+")
		} else if m != nil && m.xnack {
			feats = append(feats, "xnack-")
		}
	} else {
		switch flags & efSrameccV4 {
		case efSrameccOffV4:
			feats = append(feats, "sramecc-")
		case efSrameccOnV4:
			feats = append(feats, "sramecc+")
		}
		switch flags & efXnackV4 {
		case efXnackOffV4:
			feats = append(feats, "xnack-")
		case efXnackOnV4:
			feats = append(feats, "xnack+")
		}
		if abiVersion >= abiVersionV6 {
			genericVersion = int((flags & efGenericVersion) >> efGenericVersionShift)
		}
	}
	t.Features = strings.Join(feats, ":")
	return t, genericVersion
}

// TargetFromName reads the target from the base name of a file that ROCm
// ships beside its libraries: Tensile and hipBLASLt code objects
// (TensileLibrary_gfx90a.co, Kernels.so-000-gfx90a-xnack-.hsaco,
// TensileLibrary_Type_HH_..._gfx942.co, TensileLibrary_lazy_gfx1030.dat) and
// MIOpen kernel databases, whose names append the compute unit count to the
// target (gfx90a68.kdb, gfx1030_36.kdb, gfx942130.kdb). The processor is the
// longest name of the EF_AMDGPU_MACH table that starts where "gfx" does
// (after the start of the name or a byte that is not a letter or digit) and
// is followed, after digits if any (the CU count), by the end or a byte
// that is not a letter; target features written right after it
// ("-xnack-", "_sramecc+_xnack-") are read too. Names that merely contain "gfx" without a known target give
// false.
func TargetFromName(base string) (Target, bool) {
	if len(base) > 4096 {
		base = base[:4096]
	}
	for off := 0; off < len(base); {
		i := strings.Index(base[off:], "gfx")
		if i < 0 {
			break
		}
		i += off
		off = i + 1
		if i > 0 && isAlnum(base[i-1]) {
			continue
		}
		rest := base[i:]
		for _, n := range knownNames {
			if !strings.HasPrefix(rest, n) {
				continue
			}
			after := rest[len(n):]
			// A CU count: digits, then the end or a separator.
			d := 0
			for d < len(after) && after[d] >= '0' && after[d] <= '9' {
				d++
			}
			if d < len(after) && isLetter(after[d]) {
				// "gfx1030a", "gfx90a6e": another word, not this target.
				continue
			}
			return Target{Kind: KindName, Triple: TripleAMDHSA, Processor: n, Features: nameFeatures(after)}, true
		}
	}
	return Target{}, false
}

// nameFeatures reads feature settings that follow a processor in a file
// name: "-xnack-", "_xnack+", ":sramecc+:xnack-".
func nameFeatures(s string) string {
	var feats []string
	seen := map[string]bool{}
	for len(s) > 0 {
		if s[0] == '-' || s[0] == '_' || s[0] == ':' {
			s = s[1:]
		}
		var name string
		for _, f := range []string{"sramecc", "xnack"} {
			if strings.HasPrefix(s, f) && len(s) > len(f) && (s[len(f)] == '+' || s[len(f)] == '-') {
				name = f
				break
			}
		}
		if name == "" || seen[name] {
			break
		}
		seen[name] = true
		feats = append(feats, s[:len(name)+1])
		s = s[len(name)+1:]
	}
	slices.Sort(feats)
	return strings.Join(feats, ":")
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isAlnum(c byte) bool  { return isLetter(c) || c >= '0' && c <= '9' }

// SupportsFeature reports whether processor p supports target feature f
// ("xnack", "sramecc"); known is false when kiln's table lacks p or f.
func SupportsFeature(p, f string) (ok, known bool) { return supports(p, f) }
