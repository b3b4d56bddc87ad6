package kfd

import "fmt"

// GFXTarget turns KFD's gfx_target_version into the LLVM target name:
// major*10000 + minor*100 + stepping, with minor and stepping printed as
// hex digits (90010 -> gfx90a, 90402 -> gfx942, 110000 -> gfx1100). Values
// of 200000 and more are read as the hex-packed form some kernels are said
// to print (0x0b0501 -> gfx1151). It returns "" for 0 (CPU nodes) and for
// values it cannot name.
func GFXTarget(v uint64) string {
	if v == 0 {
		return ""
	}
	var major, minor, step uint64
	if v >= 200000 {
		major, minor, step = v>>16, (v>>8)&0xff, v&0xff
	} else {
		major, minor, step = v/10000, (v/100)%100, v%100
	}
	if major == 0 || major > 99 || minor > 15 || step > 15 {
		return ""
	}
	return fmt.Sprintf("gfx%d%x%x", major, minor, step)
}

// PCIAddress turns KFD's domain and location_id (bus<<8 | device<<3 |
// function) into a canonical PCI address "dddd:bb:dd.f".
func PCIAddress(domain, location uint64) string {
	if domain > 0xffff || location > 0xffff {
		return ""
	}
	bus := location >> 8
	dev := (location >> 3) & 0x1f
	fn := location & 7
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn)
}

// IO link types from the kernel's CRAT definitions (kfd_crat.h).
const (
	LinkTypeHyperTransport = 1
	LinkTypePCIe           = 2
	LinkTypeQPI            = 5
	LinkTypeXGMI           = 11
)

// partitionMode names an AMD compute partition mode from the number of KFD
// nodes one physical GPU shows and the XCCs each has. One XCC per node with
// several nodes is CPX; otherwise the node count names the mode.
func partitionMode(nodes int, xccPerNode uint64) string {
	switch {
	case nodes > 1 && xccPerNode == 1:
		return "CPX"
	case nodes == 1 && xccPerNode > 1:
		return "SPX"
	case nodes == 2:
		return "DPX"
	case nodes == 3:
		return "TPX"
	case nodes == 4:
		return "QPX"
	}
	return ""
}
