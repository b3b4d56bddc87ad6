// Package hostmem allocates host memory for GPU benchmarks outside Go's
// heap (so a driver may pin it and the garbage collector never moves it),
// placed on a chosen NUMA node, and reads the host's NUMA layout from
// sysfs.
package hostmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrPlacement is wrapped by Alloc's error when the memory could be
// mapped but not bound to the NUMA node asked for.
var ErrPlacement = errors.New("host memory cannot be placed on a NUMA node")

// Region is host memory mapped outside Go's heap. Its address stays valid
// until Free.
type Region struct {
	mem []byte
	// Node is the NUMA node the memory is bound to, -1 when not placed.
	Node int
}

// Len is the region's size in bytes.
func (r *Region) Len() int { return len(r.mem) }

// maxList bounds the numbers a list may hold: more NUMA nodes or CPUs than
// any machine has means the text is not a list.
const maxList = 1 << 16

// ParseList reads a kernel list ("0-3,8,10-11"; empty for none), as
// /sys/devices/system/node/has_memory and cpulist files write it.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("list %q: %q is not a number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("list %q: bad range %q", s, part)
			}
		}
		if b >= maxList || len(out)+(b-a) >= maxList {
			return nil, fmt.Errorf("list %q: too many entries", s)
		}
		for v := a; v <= b; v++ {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Nodes lists the NUMA nodes with memory under sysRoot ("/" for this
// machine); none when the kernel reports no NUMA nodes.
func Nodes(sysRoot string) ([]int, error) {
	dir := filepath.Join(sysRoot, "sys/devices/system/node")
	for _, name := range []string{"has_memory", "online"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return ParseList(string(b))
	}
	return nil, nil
}

// DeviceNode is the NUMA node sysfs gives a PCI device (canonical
// address) under sysRoot; nil when unknown, -1 when the platform reports
// no affinity.
func DeviceNode(sysRoot, pci string) *int {
	if pci == "" || strings.ContainsAny(pci, "/\\") || strings.Contains(pci, "..") {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(sysRoot, "sys/bus/pci/devices", pci, "numa_node"))
	if err != nil {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < -1 || n >= maxList {
		return nil
	}
	if n < -1 {
		n = -1
	}
	return &n
}
