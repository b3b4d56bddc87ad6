package capture

import (
	"kiln.dev/kiln/kb"

	"fmt"
	"math"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Value helpers shared by the rocm-smi and amd-smi importers.

// amdUnknown says whether a printed value means "not known".
func amdUnknown(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "n/a", "[n/a]", "na", "not supported", "not_supported", "none", "unknown", "unsupported", "-":
		return true
	}
	return false
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
