package capture

// Plain nvidia-smi: the boxed summary table. Each GPU takes one box of two
// or three rows:
//
//	|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |
//	| N/A   27C    P0             72W /  700W |       1MiB /  81559MiB |      0%      Default |
//	|                                         |                        |             Disabled |
//
// then a Processes table. Names longer than the column are cut ("NVIDIA
// GeForce ..."); such a name is not kept as a model.

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

const kindNvsmiSummary = "nvidia-smi"

func init() {
	RegisterFile(FileImporter{
		Kind:   kindNvsmiSummary,
		Detect: detectNvsmiSummary,
		Parse:  func(_ string, data []byte) (*snapshot.Snapshot, error) { return ParseNvidiaSMISummary(data) },
	})
}

var nvsmiSummaryHeader = lazy(`^\|\s*NVIDIA-SMI\s+(\S+)`)

// nvsmiSummaryGPURow is the first row of a GPU's box, "|   0  NVIDIA A40
// On   | 00000000:1A:00.0 Off |   0 |": a table pasted without its header
// is still one.
var nvsmiSummaryGPURow = lazy(`^\|\s*\d{1,3}\s+.*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]`)

func detectNvsmiSummary(_ string, data []byte) bool {
	found := false
	n := 0
	forEachLine(data, func(ln []byte) bool {
		t := bytes.TrimSpace(ln)
		if len(t) > 0 && t[0] == '|' && (nvsmiSummaryHeader().Match(t) || nvsmiSummaryGPURow().Match(t)) {
			found = true
			return false
		}
		n++
		return n < 64
	})
	return found
}

var (
	nvsmiSummaryDriver = lazy(`Driver Version:\s*(\S+)`)
	nvsmiSummaryCUDA   = lazy(`CUDA Version:\s*(\S+)`)
)

// cells splits a table row "| a | b | c |" into its trimmed cells.
func nvsmiCells(line string) []string {
	t := strings.TrimSpace(line)
	t = strings.TrimPrefix(t, "|")
	t = strings.TrimSuffix(t, "|")
	parts := strings.Split(t, "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// ParseNvidiaSMISummary reads the plain `nvidia-smi` table: nvidia-smi,
// driver and CUDA versions, and per GPU its index, name (unless cut),
// persistence mode or driver model, PCI address, volatile uncorrectable ECC
// count, fan, temperature, performance state, power draw and cap, memory
// use, utilization, compute mode, MIG mode, and the number of processes.
func ParseNvidiaSMISummary(data []byte) (*snapshot.Snapshot, error) {
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{}
	notes := &nvsmiNotes{source: kindNvsmiSummary}
	header := -1
	for i, ln := range lines {
		t := strings.TrimSpace(ln)
		if m := nvsmiSummaryHeader().FindStringSubmatch(t); m != nil && header < 0 {
			header = i
			s.Sources = []snapshot.Source{{Kind: kindNvsmiSummary, Version: m[1]}}
			if m := nvsmiSummaryDriver().FindStringSubmatch(t); m != nil && !nvsmiUnknown(m[1]) {
				s.Drivers.NVIDIAUser = m[1]
			}
			if m := nvsmiSummaryCUDA().FindStringSubmatch(t); m != nil && !nvsmiUnknown(m[1]) {
				s.Drivers.CUDADriver = m[1]
			}
			// The date line printed just above the table's top rule.
			for j := i - 1; j >= 0 && j >= i-3; j-- {
				prev := strings.TrimSpace(lines[j])
				if k := strings.LastIndex(prev, "+"); k >= 0 {
					prev = strings.TrimSpace(prev[k+1:])
				}
				if ts, ok := nvsmiTime(prev); ok {
					s.CollectedAt = ts
					break
				}
			}
		}
	}
	// The GPU table starts after the first "|===" rule below the header and
	// ends at the first line that is not part of a box. A table pasted
	// without its header starts at its first GPU row.
	i := header + 1
	if header < 0 {
		i = 0
		for i < len(lines) && !nvsmiSummaryGPURow().MatchString(strings.TrimSpace(lines[i])) {
			i++
		}
		if i == len(lines) {
			return nil, fmt.Errorf("no nvidia-smi table found (no \"| NVIDIA-SMI\" header line and no GPU row)")
		}
		s.Sources = []snapshot.Source{{Kind: kindNvsmiSummary}}
		notes.add("the table has no header: driver and CUDA versions unknown")
	} else {
		for i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "|=") {
			i++
		}
		if i == len(lines) {
			return nil, fmt.Errorf("line %d: the nvidia-smi table has no \"|===\" rule above its GPU rows", header+1)
		}
		i++
	}
	var box []int // line numbers of the current GPU box
	flush := func() error {
		if len(box) == 0 {
			return nil
		}
		g, err := nvsmiSummaryGPU(lines, box, notes)
		if err == nil {
			if ev, ok := nvsmiSummaryErrors(lines, box, g); ok {
				s.Events = append(s.Events, ev)
			}
		}
		box = box[:0]
		if err != nil {
			return err
		}
		s.GPUs = append(s.GPUs, g)
		return nil
	}
	for ; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if strings.HasPrefix(t, "+") {
			if err := flush(); err != nil {
				return nil, err
			}
			// "+---...---+Mon Jan 20 ..." : another capture glued on.
			if !strings.HasSuffix(t, "+") {
				break
			}
			continue
		}
		if !strings.HasPrefix(t, "|") {
			break
		}
		box = append(box, i)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	nvsmiSummaryProcesses(lines, i, s, notes)
	var warnings []string
	for _, ln := range lines {
		if nvsmiIsWarning(strings.TrimSpace(ln)) {
			warnings = append(warnings, ln)
		}
	}
	s.Notes = append(s.Notes, notes.notes...)
	nvsmiWarnings(s, kindNvsmiSummary, warnings)
	s.Events = append(s.Events, scanToolErrors(data, kindNvsmiSummary)...)
	return s, nil
}

func nvsmiSummaryGPU(lines []string, box []int, notes *nvsmiNotes) (snapshot.GPU, error) {
	g := snapshot.GPU{Vendor: snapshot.VendorNVIDIA}
	at := func(row int) string { return fmt.Sprintf("line %d", box[row]+1) }
	r0 := nvsmiCells(lines[box[0]])
	if len(r0) < 2 {
		return g, fmt.Errorf("%s: cannot read %q as a GPU row (want \"| index name persistence | bus-id disp | ecc |\")", at(0), strings.TrimSpace(lines[box[0]]))
	}
	// Cell 0: "0  NVIDIA H100 80GB HBM3          On"
	f := strings.Fields(r0[0])
	if len(f) < 2 {
		return g, fmt.Errorf("%s: cannot read %q as GPU index and name", at(0), r0[0])
	}
	idx, err := strconv.Atoi(f[0])
	if err != nil || idx < 0 {
		return g, fmt.Errorf("%s: cannot read %q as a GPU index", at(0), f[0])
	}
	g.Index = idx
	name := f[1:]
	if last := name[len(name)-1]; len(name) > 1 {
		switch strings.ToLower(last) {
		case "on", "off":
			g.Persistence = snapshot.Ptr(strings.EqualFold(last, "on"))
			name = name[:len(name)-1]
		case "wddm", "tcc", "mcdm":
			g.DriverModel = strings.ToUpper(last)
			name = name[:len(name)-1]
		case "n/a":
			name = name[:len(name)-1]
		}
	}
	// Cell 1: "00000000:19:00.0 Off" (or "00000000:19:00.0Off" where the
	// columns ran together).
	bus := rePCIInCell().FindString(r0[1])
	if bus == "" {
		return g, fmt.Errorf("%s: the GPU row has no Bus-Id in %q", at(0), r0[1])
	}
	addr, err := snapshot.CanonicalPCI(bus)
	if err != nil {
		return g, fmt.Errorf("%s: cannot read %q as a PCI address: %w", at(0), bus, err)
	}
	g.PCIAddress = addr
	notes.gpu = addr
	defer func() { notes.gpu = "" }()
	model := strings.Join(name, " ")
	if strings.HasPrefix(model, "ERR!") {
		notes.add("product name reads ERR! (the driver could not read it); model left unknown")
	} else if strings.HasSuffix(model, "...") {
		notes.add("product name printed cut to %q; model left unknown", model)
	} else {
		g.Model = model
	}
	if len(r0) > 2 {
		if c := notes.count(nvVal{s: r0[2], at: at(0) + " (Volatile Uncorr. ECC)"}, "an ECC error count"); c != nil {
			g.ECC = &snapshot.ECC{VolatileUncorrectable: c}
		}
	}
	if len(box) > 1 {
		nvsmiSummaryRow2(&g, nvsmiCells(lines[box[1]]), at(1), notes)
	}
	if len(box) > 2 {
		r2 := nvsmiCells(lines[box[2]])
		if mig := (nvVal{s: r2[len(r2)-1], at: at(2) + " (MIG M.)"}); mig.known() {
			if on := notes.flag(mig, "a MIG mode"); on != nil {
				g.MIG = &snapshot.MIG{Enabled: *on}
			}
		}
	}
	return g, nil
}

var rePCIInCell = lazy(`[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]`)

// nvsmiSummaryErrors: a GPU whose box is mostly ERR! is a GPU the driver
// cannot talk to. A few ERR! (a fan's tachometer, a power sensor, the name
// query) are faults of what they name, while the rest of the GPU answers.
func nvsmiSummaryErrors(lines []string, box []int, g snapshot.GPU) (snapshot.Event, bool) {
	errs, fields := 0, 0
	for _, b := range box {
		for _, c := range nvsmiCells(lines[b]) {
			for _, f := range strings.Fields(c) {
				if f == "/" {
					continue
				}
				fields++
				if strings.HasPrefix(f, "ERR!") {
					errs++
				}
			}
		}
	}
	if errs < 4 {
		return snapshot.Event{}, false
	}
	return snapshot.Event{Source: kindNvsmiSummary, Kind: snapshot.EventToolError, Reason: snapshot.ToolGPUError, Device: g.PCIAddress,
		Message: fmt.Sprintf("nvidia-smi printed ERR! for %d of the %d fields of GPU %d (%s)", errs, fields, g.Index, g.PCIAddress)}, true
}

// nvsmiSummaryRow2 reads "| N/A   27C    P0   72W /  700W |   1MiB /  81559MiB |   0%   Default |".
func nvsmiSummaryRow2(g *snapshot.GPU, r []string, at string, notes *nvsmiNotes) {
	if len(r) > 0 {
		f := strings.Fields(r[0])
		rest := f
		if len(f) > 0 {
			fan := f[0]
			switch {
			case strings.HasSuffix(fan, "%"):
				if p := notes.number(nvVal{s: fan, at: at + " (Fan)"}, "a fan speed", "%"); p != nil {
					g.Fans = []snapshot.Fan{{Percent: p}}
				}
			case nvsmiUnknown(fan):
			default:
				g.Fans = []snapshot.Fan{{Error: fan}}
			}
			rest = f[1:]
		}
		if len(rest) > 0 {
			if c := notes.number(nvVal{s: rest[0], at: at + " (Temp)"}, "a temperature", "C"); c != nil {
				g.Temperature = &snapshot.Temperature{GPUC: c}
			}
			rest = rest[1:]
		}
		if len(rest) > 0 && strings.HasPrefix(rest[0], "P") {
			g.PerformanceState = rest[0]
			rest = rest[1:]
		}
		if use, limit, ok := strings.Cut(strings.Join(rest, " "), "/"); ok {
			p := snapshot.Power{
				DrawW:  notes.number(nvVal{s: strings.TrimSpace(use), at: at + " (Pwr:Usage)"}, "a power draw", "W"),
				LimitW: notes.number(nvVal{s: strings.TrimSpace(limit), at: at + " (Pwr:Cap)"}, "a power limit", "W"),
			}
			if p != (snapshot.Power{}) {
				g.Power = &p
			}
		}
	}
	if len(r) > 1 {
		if used, total, ok := strings.Cut(r[1], "/"); ok {
			if b := notes.bytes(nvVal{s: strings.TrimSpace(used), at: at + " (Memory-Usage)"}, "a memory size"); b != nil {
				g.MemoryUsedBytes = *b
			}
			if b := notes.bytes(nvVal{s: strings.TrimSpace(total), at: at + " (Memory-Usage)"}, "a memory size"); b != nil {
				g.MemoryTotalBytes = *b
			}
		}
	}
	if len(r) > 2 {
		f := strings.Fields(r[2])
		if len(f) > 0 {
			g.UtilizationGPU = notes.number(nvVal{s: f[0], at: at + " (GPU-Util)"}, "a utilization", "%")
			mode := strings.Join(f[1:], " ")
			switch mode {
			case "E. Process":
				mode = "Exclusive_Process"
			case "E. Thread":
				mode = "Exclusive_Thread"
			}
			if !nvsmiUnknown(mode) {
				g.ComputeMode = mode
			}
		}
	}
}

// nvsmiSummaryProcesses counts the rows of the Processes table per GPU.
func nvsmiSummaryProcesses(lines []string, from int, s *snapshot.Snapshot, notes *nvsmiNotes) {
	i := from
	for i < len(lines) && !strings.Contains(lines[i], "Processes:") {
		i++
	}
	for i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "|=") {
		i++
	}
	byIndex := map[int]int{}
	for i++; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(t, "|") {
			if strings.HasPrefix(t, "+") {
				continue
			}
			break
		}
		f := strings.Fields(strings.Trim(t, "| "))
		if len(f) < 3 {
			continue
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		byIndex[idx]++
	}
	for idx, n := range byIndex {
		found := false
		for j := range s.GPUs {
			if s.GPUs[j].Index == idx {
				s.GPUs[j].Processes = n
				found = true
			}
		}
		if !found {
			notes.add("the Processes table lists GPU %d, which the GPU table does not show", idx)
		}
	}
}
