package capture

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// The nvidia-smi-topo importer reads `nvidia-smi topo -m`: a matrix of GPUs
// and NICs with the kind of path between each pair (X, NV18, PIX, PXB, PHB,
// NODE, SYS), then the CPU and NUMA affinity of each GPU, then optional
// "Legend:" and "NIC Legend:" blocks. Columns are tab-separated as printed
// by the tool, or space-aligned when copied from a terminal.

const kindTopoM = "nvidia-smi-topo"

func init() {
	RegisterFile(FileImporter{
		Kind:   kindTopoM,
		Detect: detectTopoM,
		Parse: func(_ string, data []byte) (*snapshot.Snapshot, error) {
			return ParseNvidiaSMITopo(data)
		},
	})
}

// topoMCell says whether a cell is one of the path codes nvidia-smi prints.
func topoMCell(c string) bool {
	switch c {
	case "X", "SYS", "NODE", "PHB", "PXB", "PIX", "SOC", "NV#":
		return true
	}
	if n, ok := topoMNV(c); ok && n > 0 {
		return true
	}
	return false
}

// topoMNV reads "NV18" as 18.
func topoMNV(c string) (int, bool) {
	if !strings.HasPrefix(c, "NV") {
		return 0, false
	}
	n, err := strconv.Atoi(c[2:])
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// topoMHeader splits the header line into device names and trailing
// column titles. ok is false when the line is not a matrix header.
func topoMHeader(line string) (devs, trailing []string, ok bool) {
	var cols []string
	if strings.Contains(line, "\t") {
		for _, c := range strings.Split(line, "\t") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
	} else {
		// Titles hold single spaces ("CPU Affinity"); columns are parted by two or more.
		for _, c := range strings.Split(strings.TrimSpace(line), "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
	}
	for i, c := range cols {
		if strings.Contains(c, " ") || strings.Contains(c, "Affinity") {
			devs, trailing = cols[:i], cols[i:]
			break
		}
		if i == len(cols)-1 {
			devs = cols
		}
	}
	if len(devs) == 0 || devs[0] != "GPU0" {
		return nil, nil, false
	}
	return devs, trailing, true
}

// detectTopoM recognises the matrix: a header whose first column is GPU0,
// followed by a GPU0 row whose first cell is "X" (rocm-smi prints 0 on the
// diagonal) and whose cells are nvidia-smi path codes.
func detectTopoM(_ string, data []byte) bool {
	if len(data) > 256<<10 {
		data = data[:256<<10]
	}
	var devs []string
	for raw := range bytes.Lines(data) {
		line := strings.TrimRight(string(raw), "\r\n")
		if devs == nil {
			if d, _, ok := topoMHeader(line); ok {
				devs = d
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "GPU0" {
			return false
		}
		if f[1] != "X" {
			return false
		}
		for _, c := range f[1:min(len(f), len(devs)+1)] {
			if !topoMCell(c) {
				return false
			}
		}
		return true
	}
	return false
}

// ParseNvidiaSMITopo reads `nvidia-smi topo -m`. It fills Snapshot.Matrix,
// one GPU per GPU row (MatrixName, Index, NUMA node and CPU affinity; no PCI
// address is printed), and an NVLink Link for each GPU pair printed as NV<n>.
func ParseNvidiaSMITopo(data []byte) (*snapshot.Snapshot, error) {
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	start := -1
	var devs, trailing []string
	for i, l := range lines {
		if d, t, ok := topoMHeader(l); ok {
			start, devs, trailing = i, d, t
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("nvidia-smi topo -m: no header line starting with GPU0")
	}
	m := &snapshot.TopoMatrix{Source: kindTopoM, Devices: devs, Cells: make([][]string, len(devs))}
	pos := make(map[string]int, len(devs))
	for i, d := range devs {
		if _, dup := pos[d]; dup {
			return nil, fmt.Errorf("nvidia-smi topo -m: line %d: device %s appears twice in the header", start+1, d)
		}
		pos[d] = i
	}
	snap := snapshot.New()
	rows := 0
	i := start + 1
	for ; i < len(lines); i++ {
		f := strings.Fields(lines[i])
		if len(f) == 0 {
			if rows > 0 {
				break
			}
			continue
		}
		r, ok := pos[f[0]]
		if !ok {
			break // "Legend:" or anything after the matrix
		}
		if m.Cells[r] != nil {
			if rows == len(devs) {
				// The matrix is whole: what follows is another copy of it
				// (a second capture glued on, a line cut short).
				break
			}
			return nil, fmt.Errorf("nvidia-smi topo -m: line %d: row %s appears twice", i+1, f[0])
		}
		if len(f) < len(devs)+1 {
			return nil, fmt.Errorf("nvidia-smi topo -m: line %d: row %s has %d cells, the header names %d devices", i+1, f[0], len(f)-1, len(devs))
		}
		m.Cells[r] = f[1 : len(devs)+1]
		rows++
		extra := f[len(devs)+1:]
		for k, v := range extra {
			if k >= len(trailing) || v == "N/A" {
				continue
			}
			switch trailing[k] {
			case "CPU Affinity":
				if m.CPUAffinity == nil {
					m.CPUAffinity = map[string]string{}
				}
				m.CPUAffinity[f[0]] = v
			case "NUMA Affinity":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("nvidia-smi topo -m: line %d: cannot read %q as the NUMA affinity of %s", i+1, v, f[0])
				}
				if n >= 0 {
					if m.NUMA == nil {
						m.NUMA = map[string]int{}
					}
					m.NUMA[f[0]] = n
				}
			}
		}
	}
	for r, row := range m.Cells {
		if row == nil {
			return nil, fmt.Errorf("nvidia-smi topo -m: the header names %s but no row follows for it", devs[r])
		}
	}
	for ; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		name, alias, ok := strings.Cut(t, ": ")
		if !ok {
			continue
		}
		if _, known := pos[name]; known && !strings.Contains(alias, " ") && alias != "" {
			if m.Aliases == nil {
				m.Aliases = map[string]string{}
			}
			m.Aliases[name] = strings.TrimSpace(alias)
		}
	}
	snap.Matrix = m

	var gpus []int
	for r, d := range devs {
		if !strings.HasPrefix(d, "GPU") {
			continue
		}
		idx, err := strconv.Atoi(d[3:])
		if err != nil || idx < 0 {
			continue
		}
		g := snapshot.GPU{Index: idx, Vendor: snapshot.VendorNVIDIA, MatrixName: d, CPUAffinity: m.CPUAffinity[d]}
		if n, ok := m.NUMA[d]; ok {
			g.NUMANode = snapshot.Ptr(n)
		}
		snap.GPUs = append(snap.GPUs, g)
		gpus = append(gpus, r)
	}
	sort.SliceStable(snap.GPUs, func(a, b int) bool { return snap.GPUs[a].Index < snap.GPUs[b].Index })
	for a := 0; a < len(gpus); a++ {
		for b := a + 1; b < len(gpus); b++ {
			i, j := gpus[a], gpus[b]
			n, ok := topoMNV(m.Cells[i][j])
			if !ok || n == 0 {
				continue
			}
			snap.Links = append(snap.Links, snapshot.Link{A: devs[i], B: devs[j], Kind: snapshot.LinkNVLink, Count: n})
		}
	}
	return snap, nil
}
