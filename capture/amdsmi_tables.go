package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"kiln.dev/kiln/snapshot"
)

// amd-smi's tables (text output):
//
//   - `amd-smi monitor`: a header of upper-case column names ("GPU  POWER
//     GPU_TEMP  MEM_TEMP  GFX_UTIL ...", "TIMESTAMP" first in watch mode),
//     then one row per GPU, each value followed by its unit ("182 W",
//     "42 °C", "83 %", "1613 MHz", "1235 MB"; "N/A" alone or with a unit);
//     `-q` adds a "PROCESS INFO:" table after a blank line.
//   - `amd-smi topology`: titled tables ("ACCESS TABLE:", "WEIGHT TABLE:",
//     "HOPS TABLE:", "LINK TYPE TABLE:", ...) with a header of BDFs and one
//     row per BDF.
//
// Monitor rows become the same per-GPU entries as `amd-smi metric --json`
// (so amdFill reads them); topology tables become the GPUs they name, a
// matrix and links.

// amdMonCols maps a monitor column to the metric entry path amdFill reads;
// nil for a column kiln knows but has no field for.
var amdMonCols = map[string][]string{
	"POWER":       {"power", "socket_power"},
	"GPU_TEMP":    {"temperature", "hotspot"},
	"MEM_TEMP":    {"temperature", "mem"},
	"GFX_UTIL":    {"usage", "gfx_activity"},
	"GFX_CLOCK":   {"clock", "gfx_0", "clk"},
	"MEM_UTIL":    {"usage", "umc_activity"},
	"MEM_CLOCK":   {"clock", "mem_0", "clk"},
	"SINGLE_ECC":  {"ecc", "total_correctable_count"},
	"DOUBLE_ECC":  {"ecc", "total_uncorrectable_count"},
	"PCIE_REPLAY": {"pcie", "replay_count"},
	"VRAM_USED":   {"mem_usage", "used_vram"},
	"VRAM_TOTAL":  {"mem_usage", "total_vram"},
	"ENC_UTIL":    nil, "ENC_CLOCK": nil, "DEC_UTIL": nil, "DEC_CLOCK": nil,
	"PCIE_BW": nil, "THROTTLE": nil,
	"PVIOL": nil, "TVIOL": nil, "PHOT_TVIOL": nil, "VR_TVIOL": nil, "HBM_TVIOL": nil,
}

var (
	amdColName   = lazy(`^[A-Z][A-Z0-9_]*$`)
	amdTopoTitle = lazy(`^([A-Z][A-Z0-9 _-]*?) TABLE:$`)
)

// amdMaxMonRows bounds the monitor rows one file gives, amdMaxTopoCols the
// columns of a topology table (a host's logical GPUs: 8 devices of 8
// partitions are 64).
const (
	amdMaxMonRows  = 1 << 16
	amdMaxTopoCols = 1024
)

// amdMonHeader returns the columns of a monitor header line, or nil.
func amdMonHeader(f []string) []string {
	if len(f) < 2 {
		return nil
	}
	i := 0
	if f[0] == "TIMESTAMP" {
		i = 1
	}
	if i >= len(f) || f[i] != "GPU" {
		return nil
	}
	known := 0
	for _, c := range f[i+1:] {
		if !amdColName().MatchString(c) {
			return nil
		}
		if _, ok := amdMonCols[c]; ok {
			known++
		}
	}
	if known < 2 && !(known == 1 && len(f) == i+2) {
		return nil
	}
	return f
}

// amdProcHeader says whether f is the process table's header.
func amdProcHeader(f []string) (gpuCol int, ok bool) {
	if len(f) >= 3 && f[0] == "TIMESTAMP" {
		f, gpuCol = f[1:], 1
	}
	return gpuCol, len(f) >= 2 && f[0] == "GPU" && f[1] == "NAME"
}

// amdIsUnit says whether a token is the unit after a value ("W", "°C",
// "%", "MHz", "Mb/s").
func amdIsUnit(t string) bool {
	if t == "" || len(t) > 8 || amdUnknown(t) {
		return false
	}
	if _, ok := amdNum(t); ok {
		return false
	}
	for _, r := range t {
		if !unicode.IsLetter(r) && r != '%' && r != '/' && r != '°' {
			return false
		}
	}
	return true
}

// amdMonRow splits a row into its cells, a value with its unit each.
func amdMonRow(f, cols []string) (map[string]string, bool) {
	out := make(map[string]string, len(cols))
	i := 0
	for _, c := range cols {
		if i >= len(f) {
			return nil, false
		}
		v := f[i]
		i++
		if c != "GPU" && c != "TIMESTAMP" && i < len(f) && amdIsUnit(f[i]) {
			v += " " + f[i]
			i++
		}
		out[c] = v
	}
	return out, i == len(f)
}

// amdTopoTable is one `amd-smi topology` table.
type amdTopoTable struct {
	title string   // "WEIGHT", "LINK TYPE"
	cols  []string // canonical BDFs
	col   map[string]int
	rows  map[string][]string
}

func (t *amdTopoTable) cell(a, b string) string {
	for _, p := range [][2]string{{a, b}, {b, a}} {
		r := t.rows[p[0]]
		if j, ok := t.col[p[1]]; ok && j < len(r) {
			return r[j]
		}
	}
	return ""
}

// amdTables is what a text capture holds besides "GPU: n" blocks.
type amdTables struct {
	monitor  map[int]map[string]string
	procs    map[int]map[string]bool
	topo     []*amdTopoTable
	notes    []string
	kvGPUs   bool // the capture also has "GPU: n" blocks
	topoGPUs bool
}

// amdHasTable says whether data holds a monitor or topology table.
func amdHasTable(data []byte) bool {
	if !mayHoldAMDTable(data) {
		return false
	}
	t := amdScanTables(data)
	return len(t.monitor) > 0 || len(t.topo) > 0
}

// mayHoldAMDTable is a cheap test before the scan: a monitor table's header
// starts a line with "GPU" and blanks (or "TIMESTAMP"), a topology table's
// title ends in "TABLE:". Detection runs on every file kiln reads.
func mayHoldAMDTable(data []byte) bool {
	found := false
	forEachLine(data, func(line []byte) bool {
		line = bytes.TrimLeft(line, " \t")
		found = bytes.HasPrefix(line, []byte("GPU  ")) || bytes.HasPrefix(line, []byte("GPU\t")) || bytes.HasPrefix(line, []byte("TIMESTAMP")) ||
			bytes.HasSuffix(bytes.TrimRight(line, " \t"), []byte("TABLE:"))
		return !found
	})
	return found
}

func amdScanTables(data []byte) *amdTables {
	t := &amdTables{monitor: map[int]map[string]string{}, procs: map[int]map[string]bool{}}
	const (
		none = iota
		monitor
		procTitle
		procs
		topoTitle
		topo
	)
	state := none
	var cols []string
	procGPU := 0
	var cur *amdTopoTable
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	rows := 0
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		f := strings.Fields(line)
		if len(f) == 0 {
			if state != procTitle && state != topoTitle {
				state = none
			}
			continue
		}
	again:
		switch state {
		case none:
			if c := amdMonHeader(f); c != nil {
				state, cols = monitor, c
			} else if line == "PROCESS INFO:" {
				state = procTitle
			} else if m := amdTopoTitle().FindStringSubmatch(line); m != nil {
				state, cur = topoTitle, &amdTopoTable{title: m[1], rows: map[string][]string{}}
			}
		case monitor:
			if c := amdMonHeader(f); c != nil {
				cols = c // printed again in watch mode
				continue
			}
			id, ok := amdMonID(f, cols)
			if !ok {
				state = none
				goto again
			}
			cells, ok := amdMonRow(f, cols)
			if !ok {
				t.notes = append(t.notes, "amd-smi monitor row does not match its header: "+strings.TrimSpace(line))
				continue
			}
			if rows++; rows > amdMaxMonRows {
				continue
			}
			// In watch mode a GPU has a row per sample: the last one wins.
			t.monitor[id] = cells
		case procTitle:
			gc, ok := amdProcHeader(f)
			if !ok {
				state = none
				goto again
			}
			state, procGPU = procs, gc
		case procs:
			if procGPU >= len(f) {
				state = none
				goto again
			}
			id, err := strconv.Atoi(f[procGPU])
			if err != nil || id < 0 || id > rocmMaxIndex {
				state = none
				goto again
			}
			if t.procs[id] == nil {
				t.procs[id] = map[string]bool{}
			}
			rest := f[procGPU+1:]
			if strings.Contains(strings.Join(rest, " "), "No running processes") || len(rest) < 2 {
				continue
			}
			if len(t.procs[id]) < 1<<16 {
				t.procs[id][rest[0]+" "+rest[1]] = true // name and PID
			}
		case topoTitle:
			var bdfs []string
			for _, x := range f {
				a := amdPCI(x)
				if a == "" || !strings.Contains(x, ":") {
					bdfs = nil
					break
				}
				bdfs = append(bdfs, a)
			}
			if len(bdfs) == 0 || len(bdfs) > amdMaxTopoCols {
				state = none
				goto again
			}
			cur.cols, cur.col = bdfs, map[string]int{}
			for j, b := range bdfs {
				if _, dup := cur.col[b]; !dup {
					cur.col[b] = j
				}
			}
			t.topo = append(t.topo, cur)
			state = topo
		case topo:
			a := amdPCI(f[0])
			if a == "" || !strings.Contains(f[0], ":") {
				state = none
				goto again
			}
			if len(f)-1 != len(cur.cols) {
				t.notes = append(t.notes, fmt.Sprintf("amd-smi %s table: row %s has %d values for %d columns", strings.ToLower(cur.title), a, len(f)-1, len(cur.cols)))
				continue
			}
			cur.rows[a] = f[1:]
		}
	}
	return t
}

// amdMonID reads the GPU number of a monitor row.
func amdMonID(f, cols []string) (int, bool) {
	for i, c := range cols {
		if c != "GPU" {
			continue
		}
		if i >= len(f) {
			return 0, false
		}
		id, err := strconv.Atoi(f[i])
		return id, err == nil && id >= 0 && id <= rocmMaxIndex
	}
	return 0, false
}

// amdSet sets a nested value, creating the objects on the way.
func amdSet(m map[string]any, path []string, v any) {
	for _, k := range path[:len(path)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
}

// mergeInto adds monitor rows and the GPUs the topology tables name to the
// entries of the "GPU: n" blocks.
func (t *amdTables) mergeInto(entries []map[string]any) []map[string]any {
	t.kvGPUs = len(entries) > 0
	byID := map[int]map[string]any{}
	for _, e := range entries {
		if id, ok := amdInt64(e["gpu"]); ok {
			byID[int(id)] = e
		}
	}
	entry := func(id int) map[string]any {
		e := byID[id]
		if e == nil {
			e = map[string]any{"gpu": json.Number(strconv.Itoa(id))}
			byID[id] = e
			entries = append(entries, e)
		}
		return e
	}
	for _, id := range rocmSortedKeys(t.monitor) {
		e := entry(id)
		for col, v := range t.monitor[id] {
			if p := amdMonCols[col]; p != nil {
				amdSet(e, p, v)
			}
		}
	}
	for _, id := range rocmSortedKeys(t.procs) {
		entry(id)["process_count"] = json.Number(strconv.Itoa(len(t.procs[id])))
	}
	// Topology tables name GPUs by BDF only; a BDF no block names is a GPU
	// of its own, numbered by its column (amd-smi lists GPUs in order).
	for pos, bdf := range t.topoOrder() {
		found := false
		for _, e := range entries {
			for _, p := range [][]string{{"bdf"}, {"bus", "bdf"}} {
				if v, ok := amdStr(amdPath(e, p...)); ok && amdPCI(v) == bdf {
					found = true
				}
			}
		}
		if found {
			continue
		}
		id := pos
		for byID[id] != nil {
			id++
		}
		entry(id)["bdf"] = bdf
		t.topoGPUs = true
	}
	return entries
}

// topoOrder lists the BDFs of the topology tables in order of appearance.
func (t *amdTables) topoOrder() []string {
	var out []string
	seen := map[string]bool{}
	for _, tb := range t.topo {
		for _, c := range tb.cols {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// apply adds what the tables say about GPU pairs and the logical GPUs of a
// partitioned host to s, whose GPUs amdBuild made from the entries.
func (t *amdTables) apply(s *snapshot.Snapshot) {
	for _, n := range t.notes {
		s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi", Message: n})
	}
	if len(t.monitor) > 0 && !t.kvGPUs && len(t.topo) == 0 {
		amdFoldLogical(s)
	}
	t.applyTopology(s)
}

// applyTopology builds the matrix and links of the topology tables over
// the GPUs of s.
func (t *amdTables) applyTopology(s *snapshot.Snapshot) {
	if len(t.topo) == 0 || s.Matrix != nil {
		return
	}
	at := map[string]int{}
	for i, g := range s.GPUs {
		if g.PCIAddress != "" {
			at[g.PCIAddress] = i
		}
	}
	var bdfs []string
	var gi []int
	for _, b := range t.topoOrder() {
		if i, ok := at[b]; ok {
			bdfs = append(bdfs, b)
			gi = append(gi, i)
		}
	}
	n := len(bdfs)
	if n < 2 {
		return
	}
	tables := map[string]*amdTopoTable{}
	for _, tb := range t.topo {
		tables[tb.title] = tb
	}
	m := &snapshot.TopoMatrix{Source: "amd-smi", Cells: make([][]string, n)}
	ints := func(title string) [][]int {
		tb := tables[title]
		if tb == nil {
			return nil
		}
		out := make([][]int, n)
		for i := range out {
			out[i] = make([]int, n)
			for j := range out[i] {
				if v, ok := amdInt(tb.cell(bdfs[i], bdfs[j])); ok && v >= 0 && i != j {
					out[i][j] = v
				}
			}
		}
		return out
	}
	m.Weights, m.Hops = ints("WEIGHT"), ints("HOPS")
	kinds, access := tables["LINK TYPE"], tables["ACCESS"]
	var denied []string
	for i := 0; i < n; i++ {
		g := &s.GPUs[gi[i]]
		m.Devices = append(m.Devices, g.MatrixName)
		m.Cells[i] = make([]string, n)
		for j := 0; j < n; j++ {
			if i == j {
				m.Cells[i][j] = "X"
				continue
			}
			kind := ""
			if kinds != nil {
				kind = strings.ToUpper(kinds.cell(bdfs[i], bdfs[j]))
				if amdLinkKind(kind) == "" {
					kind = "" // SELF, UNKNOWN, N/A
				}
			}
			m.Cells[i][j] = kind
			if j < i {
				continue
			}
			if access != nil && strings.EqualFold(access.cell(bdfs[i], bdfs[j]), "DISABLED") {
				denied = append(denied, bdfs[i]+"-"+bdfs[j])
			}
			if k := amdLinkKind(kind); k != "" {
				l := snapshot.Link{A: bdfs[i], B: bdfs[j], Kind: k}
				if m.Weights != nil {
					l.Weight = m.Weights[i][j]
				}
				if m.Hops != nil {
					l.Hops = m.Hops[i][j]
				}
				s.Links = append(s.Links, l)
			}
		}
	}
	if len(denied) > 0 {
		s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi", Message: fmt.Sprintf(
			"amd-smi topology: peer access DISABLED between %d GPU pairs: %s", len(denied), strings.Join(denied[:min(len(denied), 12)], ", "))})
	}
	s.Matrix = m
}

// amdFoldLogical groups the rows of a monitor table that lists the logical
// GPUs (partitions) of a partitioned host without saying which device each
// belongs to. Power, temperatures and VRAM total are device-wide, so the
// partitions of one device read alike; the rows are folded into devices of
// k partitions only when the table is larger than a host's usual GPU count
// (12 rows or more), every group of k consecutive rows reads alike, and
// each group differs from the next. Anything less clear is left as it is.
func amdFoldLogical(s *snapshot.Snapshot) {
	n := len(s.GPUs)
	if n < 12 {
		return
	}
	for i, g := range s.GPUs {
		if g.PCIAddress != "" || len(g.KFDNodes) > 0 || g.MatrixName != "GPU"+strconv.Itoa(i) ||
			g.Power == nil || g.Power.DrawW == nil || g.Temperature == nil ||
			(g.Temperature.JunctionC == nil && g.Temperature.MemoryC == nil) {
			return
		}
	}
	alike := func(a, b *snapshot.GPU) bool {
		pa, pb := *a.Power.DrawW, *b.Power.DrawW
		if math.Abs(pa-pb) > math.Max(2, 0.01*math.Max(pa, pb)) || a.MemoryTotalBytes != b.MemoryTotalBytes {
			return false
		}
		for _, t := range [][2]*float64{{a.Temperature.JunctionC, b.Temperature.JunctionC}, {a.Temperature.MemoryC, b.Temperature.MemoryC}} {
			if (t[0] == nil) != (t[1] == nil) || t[0] != nil && math.Abs(*t[0]-*t[1]) > 1 {
				return false
			}
		}
		return true
	}
	k := 0
	for _, size := range []int{8, 6, 4, 3, 2} {
		if n%size != 0 {
			continue
		}
		ok := true
		for i := 0; i < n && ok; i++ {
			ok = alike(&s.GPUs[i-i%size], &s.GPUs[i])
		}
		if !ok {
			continue
		}
		for i := size; i < n; i += size {
			if alike(&s.GPUs[i-size], &s.GPUs[i]) {
				return // neighbouring groups read alike too: no telling where a device ends
			}
		}
		k = size
		break
	}
	if k == 0 {
		return
	}
	var out []snapshot.GPU
	for i := 0; i < n; i += k {
		g := s.GPUs[i]
		for _, p := range s.GPUs[i+1 : i+k] {
			g.Processes += p.Processes
		}
		// Per-partition readings do not describe the device.
		g.UtilizationGPU = nil
		g.MemoryTotalBytes, g.MemoryUsedBytes = 0, 0
		if g.Clocks != nil {
			g.Clocks.GraphicsMHz = nil
		}
		g.Index = len(out)
		g.Partition = &snapshot.Partition{Count: k}
		out = append(out, g)
	}
	s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi", Message: fmt.Sprintf(
		"amd-smi monitor lists %d logical GPUs without PCI addresses; power, temperatures and VRAM total repeat in %d groups of %d consecutive rows, "+
			"read as %d GPUs of %d partitions each (inferred from the readings: the table does not say which device a row belongs to); "+
			"per-partition utilization and memory are not kept", n, len(out), k, len(out), k)})
	s.GPUs = out
}

// amdBanner reads the notice amd-smi prints when it cannot open the GPU
// device nodes ("Permission needed to access required GPU device node(s):
// • /dev/kfd: Permission denied • /dev/dri/renderD*: 64 device(s)
// denied"): the values it then prints as N/A are a permission failure, not
// a GPU fault.
func amdBanner(s *snapshot.Snapshot, data []byte) {
	var denied []string
	head := false
	forEachLine(data, func(line []byte) bool {
		l := strings.TrimSpace(string(line))
		low := strings.ToLower(l)
		switch {
		case strings.HasPrefix(low, "permission needed to access"):
			head = true
		case strings.Contains(low, "permission denied") || strings.HasSuffix(low, "device(s) denied"):
			l = strings.TrimSpace(strings.TrimLeft(l, "•*- "))
			if len(denied) < 16 && len(l) < 256 {
				denied = append(denied, l)
			}
		case strings.HasPrefix(l, "{") || strings.HasPrefix(l, "GPU: "):
			return false // the tool's output proper
		}
		return true
	})
	if !head && len(denied) == 0 {
		return
	}
	msg := "amd-smi: permission needed to access the GPU device nodes"
	if len(denied) > 0 {
		msg += ": " + strings.Join(denied, "; ")
	}
	s.Events = append(s.Events, snapshot.Event{Source: "amd-smi", Kind: snapshot.EventToolError,
		Reason: snapshot.ToolPermissionDenied, Message: msg})
	s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi", Message: "amd-smi ran without access to the GPU device nodes " +
		"(not root, not in the render group): what it could not read is N/A, which says nothing about the GPUs; take the capture again as root"})
}
