package capture

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Value helpers shared by the rocm-smi and amd-smi importers.

// amdUnknown says whether a printed value means "not known". A value in
// angle brackets ("<redacted>") is a placeholder someone put in the
// capture's place, not a reading.
func amdUnknown(s string) bool {
	l := strings.ToLower(strings.TrimSpace(s))
	switch l {
	case "", "n/a", "[n/a]", "na", "not supported", "not_supported", "none", "unknown", "unsupported", "-":
		return true
	}
	return len(l) >= 2 && l[0] == '<' && l[len(l)-1] == '>'
}

// amdNum reads the number at the start of a printed value: "45.0°C",
// "173.0W", "(300Mhz)", "16.0GT/s", "0%", "-1". ok is false for an unknown
// or unreadable value and for NaN or infinite numbers.
func amdNum(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	if amdUnknown(s) {
		return 0, false
	}
	s = strings.TrimPrefix(s, "(")
	end := 0
	for end < len(s) {
		c := s[end]
		if (c >= '0' && c <= '9') || c == '.' || (end == 0 && (c == '-' || c == '+')) {
			end++
			continue
		}
		break
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// amdUint reads a non-negative integer value ("34342961152", "0").
func amdUint(s string) (uint64, bool) {
	s = strings.TrimSpace(s)
	if amdUnknown(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// amdInt reads a signed integer value ("-1", "0").
func amdInt(s string) (int, bool) {
	s = strings.TrimSpace(s)
	if amdUnknown(s) {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	return v, err == nil
}

// amdGen maps a PCIe transfer rate in GT/s to its generation; 0 if unknown.
func amdGen(gtps float64) int {
	return kb.Default().PCIeGenForGTps(gtps)
}

// amdSpeedWidth reads "16.0GT/s x16" (rocm-smi's PCIe DPM level) into a
// generation and a width; 0 for what it cannot read.
func amdSpeedWidth(s string) (gen, width int) {
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "*"))
	f := strings.Fields(s)
	for _, t := range f {
		switch {
		case strings.HasSuffix(strings.ToLower(t), "gt/s"):
			if v, ok := amdNum(t); ok {
				gen = amdGen(v)
			}
		case strings.HasPrefix(t, "x"):
			if w, err := strconv.Atoi(t[1:]); err == nil && w > 0 && w <= 32 {
				width = w
			}
		}
	}
	return gen, width
}

// amdHexID normalises a PCI id printed as "0x738c", "0x834" or "738C" to
// four lowercase hex digits; "" when it is not a 16-bit hex number.
func amdHexID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "0x")
	if s == "" || len(s) > 4 {
		return ""
	}
	v, err := strconv.ParseUint(s, 16, 16)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%04x", v)
}

// amdUniqueID normalises AMD's unique id ("0x79CCD55167A2124A") to
// lowercase "0x..." hex; "" when unknown or not hex.
func amdUniqueID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if amdUnknown(s) {
		return ""
	}
	h := strings.TrimPrefix(s, "0x")
	v, err := strconv.ParseUint(h, 16, 64)
	if err != nil || v == 0 {
		return ""
	}
	return fmt.Sprintf("0x%x", v)
}

// amdPCI canonicalises a PCI address, "" when it cannot be read.
func amdPCI(s string) string {
	if amdUnknown(s) {
		return ""
	}
	a, err := snapshot.CanonicalPCI(s)
	if err != nil {
		return ""
	}
	return a
}

func amdPower(g *snapshot.GPU) *snapshot.Power {
	if g.Power == nil {
		g.Power = &snapshot.Power{}
	}
	return g.Power
}

func amdTemp(g *snapshot.GPU) *snapshot.Temperature {
	if g.Temperature == nil {
		g.Temperature = &snapshot.Temperature{}
	}
	return g.Temperature
}

func amdClocks(g *snapshot.GPU) *snapshot.Clocks {
	if g.Clocks == nil {
		g.Clocks = &snapshot.Clocks{}
	}
	return g.Clocks
}

func amdPCIe(g *snapshot.GPU) *snapshot.PCIeLink {
	if g.PCIe == nil {
		g.PCIe = &snapshot.PCIeLink{}
	}
	return g.PCIe
}

// amdLinkKind maps a printed link type ("XGMI", "PCIE") to a Link kind.
func amdLinkKind(s string) string {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "XGMI":
		return snapshot.LinkXGMI
	case "PCIE":
		return snapshot.LinkPCIe
	}
	return ""
}

func amdECC(g *snapshot.GPU) *snapshot.ECC {
	if g.ECC == nil {
		g.ECC = &snapshot.ECC{}
	}
	return g.ECC
}

// amdCount reads a non-negative counter (a number, "12", or {"value": 12}).
func amdCount(v any) (uint64, bool) {
	f, _, ok := amdQty(v)
	if !ok || f < 0 || f > 1<<62 || f != math.Trunc(f) {
		return 0, false
	}
	return uint64(f), true
}

// amdMaxLevel is the highest frequency of a DPM level list ({"Level 0":
// "132 MHz", "Level 1": "2100 MHz"}).
func amdMaxLevel(v any) (float64, bool) {
	levels, ok := v.(map[string]any)
	if !ok {
		return 0, false
	}
	best, found := 0.0, false
	for _, l := range levels {
		if f, _, ok := amdQty(l); ok && f > 0 && (!found || f > best) {
			best, found = f, true
		}
	}
	return best, found
}

// amdCPUList turns amd-smi's CPU affinity ({"cpu_list_0": {"bitmask":
// "5555555555555555", "cpu_cores_affinity": "0-62"}, ...}) into a kernel CPU
// list. Each list is a 64-bit mask of CPUs 64N..64N+63; where a mask cannot
// be read, the printed ranges are taken as they are.
func amdCPUList(aff map[string]any) string {
	type part struct {
		n    int
		text string
	}
	var parts []part
	for k, v := range aff {
		num, ok := strings.CutPrefix(strings.ToLower(k), "cpu_list_")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 || n > 64 {
			continue
		}
		obj, _ := v.(map[string]any)
		var cpus []int
		if mask, ok := amdStr(obj["bitmask"]); ok {
			if bits, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(mask), "0x"), 16, 64); err == nil {
				for b := 0; b < 64; b++ {
					if bits&(1<<b) != 0 {
						cpus = append(cpus, 64*n+b)
					}
				}
			}
		}
		text := amdRanges(cpus)
		if text == "" {
			text, _ = amdStr(obj["cpu_cores_affinity"])
		}
		if text != "" {
			parts = append(parts, part{n, text})
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].n < parts[j].n })
	var out []string
	for _, p := range parts {
		out = append(out, p.text)
	}
	return strings.Join(out, ",")
}

// amdRanges prints ascending CPU numbers in kernel list form ("0-3,8").
func amdRanges(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}
