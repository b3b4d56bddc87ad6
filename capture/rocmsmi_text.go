package capture

import (
	"bufio"
	"bytes"
	"errors"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// rocm-smi's text layouts. Every layout is framed by banners
// ("==== ROCm System Management Interface ====", "==== End of ROCm SMI Log
// ===="); sections open with "==== Title ====". kiln reads:
//   - "GPU[0]  : Key: value" lines of any section (--showall and friends),
//     with the same keys as the JSON output;
//   - the "Weight/Hops/Link Type between two GPUs" matrices (--showtopo);
//   - the "Concise Info" table (plain `rocm-smi`), every column set from
//     ROCm 4 ("GPU Temp AvgPwr ...") to 6.1+ ("Device Node IDs ...
//     Partitions (Mem, Compute, ID)"), with the error lines old releases
//     print inside it;
//   - the "Concise Hardware Info" table (--showhw);
//   - "WARNING: ..." and "ERROR: ..." lines, kept as notes; failed reads
//     on a device that read nothing, and a driver the tool could not reach,
//     become tool-error events (rocmsmi_errors.go).
//
// Partitions listed as devices of their own (CPX, TPX) are folded into
// one GPU per physical device.

func rocmIsText(data []byte) bool {
	head := data
	if len(head) > 4096 {
		head = head[:4096]
	}
	return bytes.Contains(head, []byte("ROCm System Management Interface")) ||
		bytes.Contains(data, []byte("End of ROCm SMI Log"))
}

var (
	rocmTitle   = lazy(`^=+\s*(.*?)\s*=+$`)
	rocmGPULine = lazy(`^GPU\[(\d+)\]\s*:\s*(.*)$`)
	rocmMatName = lazy(`^GPU(\d+)$`)
)

type rocmTextParser struct {
	s       *snapshot.Snapshot
	kv      map[int]map[string]string
	topo    *rocmTopo
	concise map[int]*snapshot.GPU
	order   []int
	seen    map[int]bool
	// partID is a logical device's partition id (the concise table's
	// "Partitions (Mem, Compute, ID)", --showhw's "PARTITION ID").
	partID map[int]int
	// read says that the device's concise row holds a temperature, a power
	// or a clock: the tool could read something from it.
	read map[int]bool
	// fails are read failures the tool printed for a device; failAny those
	// it printed without naming one; driver those that say it could not
	// reach the driver at all.
	fails   map[int][]string
	failAny []string
	driver  []string
	elided  bool
	noted   map[string]bool // messages already kept as notes
}

func (p *rocmTextParser) gpu(i int) {
	if !p.seen[i] {
		p.seen[i] = true
		p.order = append(p.order, i)
	}
}

func parseRocmText(data []byte) (*snapshot.Snapshot, error) {
	p := &rocmTextParser{
		s: snapshot.New(), kv: map[int]map[string]string{}, topo: newRocmTopo(),
		concise: map[int]*snapshot.GPU{}, seen: map[int]bool{},
		partID: map[int]int{}, read: map[int]bool{}, fails: map[int][]string{},
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	section := ""
	var block []string // lines of the current section
	flush := func() {
		p.section(section, block)
		block = nil
	}
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		trim := strings.TrimSpace(line)
		if m := rocmTitle().FindStringSubmatch(trim); m != nil && strings.HasPrefix(trim, "==") {
			if m[1] == "" { // a plain rule: part of the current section
				block = append(block, "")
				continue
			}
			flush()
			section = m[1]
			continue
		}
		block = append(block, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()

	for _, i := range p.order {
		g := snapshot.GPU{Index: i, Vendor: snapshot.VendorAMD, MatrixName: "GPU" + strconv.Itoa(i)}
		if c := p.concise[i]; c != nil {
			g = *c
		}
		if kv := p.kv[i]; kv != nil {
			rocmFill(&g, kv, p.s)
		}
		p.s.GPUs = append(p.s.GPUs, g)
	}
	p.toolErrors()
	if len(p.s.GPUs) == 0 && p.s.Drivers.AMDGPU == "" && p.s.Drivers.ROCm == "" && len(p.s.Events) == 0 {
		return nil, errors.New("rocm-smi text: no GPU line, topology matrix or concise table found")
	}
	if p.elided {
		p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi",
			Message: "the concise table is cut short (\"...\"): devices after the cut are not in the capture"})
	}
	if p.topo.empty() {
		p.s.GPUs = rocmFoldPartitions(p.s.GPUs, p.partID)
	} else if len(p.partID) > 0 {
		p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi",
			Message: "partitions are listed as devices of their own: the topology matrix is over logical devices"})
	}
	rocmApplyTopo(p.s, p.topo)
	return p.s, nil
}

func (p *rocmTextParser) section(title string, lines []string) {
	lt := strings.ToLower(title)
	switch {
	case strings.Contains(lt, "between two gpus"):
		p.matrix(lt, lines)
		return
	case strings.Contains(lt, "concise info"):
		p.conciseTable(lines)
		return
	case strings.Contains(lt, "concise hardware info"):
		p.hwTable(lines)
		return
	}
	for _, line := range lines {
		trim := strings.TrimSpace(line)
		switch {
		case trim == "":
		case p.message(trim):
		case rocmGPULine().MatchString(trim):
			m := rocmGPULine().FindStringSubmatch(trim)
			i, err := strconv.Atoi(m[1])
			if err != nil || i > rocmMaxIndex {
				continue
			}
			k, v, ok := strings.Cut(m[2], ": ")
			if !ok {
				k, v, ok = strings.Cut(m[2], ":")
			}
			if !ok {
				continue
			}
			if p.kv[i] == nil {
				p.kv[i] = map[string]string{}
			}
			p.kv[i][strings.TrimSpace(k)] = strings.TrimSpace(v)
			p.gpu(i)
		default:
			k, v, ok := strings.Cut(trim, ":")
			if !ok || amdUnknown(v) {
				continue
			}
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "driver version":
				p.s.Drivers.AMDGPU = strings.TrimSpace(v)
			case "rocm version":
				p.s.Drivers.ROCm = strings.TrimSpace(v)
			}
		}
	}
}

// matrix reads one GPU x GPU table: a header of GPU names, then one row
// per GPU with its name first.
func (p *rocmTextParser) matrix(title string, lines []string) {
	what := "link type"
	switch {
	case strings.HasPrefix(title, "weight"):
		what = "weight"
	case strings.HasPrefix(title, "hops"):
		what = "hops"
	}
	var cols []int
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if cols == nil {
			if p.message(strings.TrimSpace(line)) {
				continue
			}
			for _, name := range f {
				m := rocmMatName().FindStringSubmatch(name)
				if m == nil {
					cols = nil
					break
				}
				i, _ := strconv.Atoi(m[1])
				if i > rocmMaxIndex {
					cols = nil
					break
				}
				cols = append(cols, i)
			}
			continue
		}
		m := rocmMatName().FindStringSubmatch(f[0])
		if m == nil {
			p.message(strings.TrimSpace(line))
			continue
		}
		row, _ := strconv.Atoi(m[1])
		if row > rocmMaxIndex {
			continue
		}
		p.gpu(row)
		for j, v := range f[1:] {
			if j >= len(cols) {
				break
			}
			p.gpu(cols[j])
			if cols[j] != row {
				p.topo.set(what, row, cols[j], v)
			}
		}
	}
}

// conciseTable reads the default table. Its header names the columns
// ("Device [Model : Revision] Temp Power Partitions SCLK MCLK Fan Perf
// PwrCap VRAM% GPU%", "Device Node IDs Temp ...", or the older "GPU Temp
// (DieEdge) AvgPwr SCLK ..."); a second header line may annotate them
// ("(Junction)", "(Mem, Compute, ID)"). Rows start with the device number;
// an indented line after a row is its name. Older releases print their
// read errors inside the table, before or after the header.
func (p *rocmTextParser) conciseTable(lines []string) {
	var cols []string
	header := ""
	var last *snapshot.GPU
	for _, line := range lines {
		trim := strings.TrimSpace(line)
		if trim == "" {
			continue
		}
		if cols == nil {
			if f := strings.Fields(trim); (f[0] == "GPU" || f[0] == "Device") && len(f) >= 4 &&
				(strings.Contains(trim, "Temp") || strings.Contains(trim, "SCLK")) {
				cols = rocmTokens(trim, true)
				header = trim
				continue
			}
			p.message(trim)
			continue
		}
		if trim == "..." {
			p.elided = true
			last = nil
			continue
		}
		if !rocmIsInt(strings.Fields(trim)[0]) {
			switch {
			case p.message(trim):
			case last != nil && strings.HasPrefix(line, " ") && last.Model == "" && last.DeviceID == "" && !strings.HasPrefix(trim, "("):
				// The name column: the marketing name, or the device id
				// where rocm-smi knows no name ("0x744c").
				if id := amdHexID(trim); id != "" && strings.HasPrefix(strings.ToLower(trim), "0x") {
					last.DeviceID = id
				} else {
					last.Model = trim
				}
			case last == nil:
				header += " " + trim
			}
			continue
		}
		vals := rocmTokens(trim, false)
		if len(vals) != len(cols) {
			p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi",
				Message: "concise table row does not match its header: " + trim})
			last = nil
			continue
		}
		i, err := strconv.Atoi(vals[0])
		if err != nil || i < 0 || i > rocmMaxIndex {
			continue
		}
		g := &snapshot.GPU{Index: i, Vendor: snapshot.VendorAMD, MatrixName: "GPU" + strconv.Itoa(i)}
		for c, name := range cols[1:] {
			read, pid := rocmConciseCell(g, strings.ToLower(name), vals[c+1], header)
			if read {
				p.read[i] = true
			}
			if pid >= 0 {
				p.partID[i] = pid
			}
		}
		p.concise[i] = g
		p.gpu(i)
		last = g
	}
}

// rocmConciseCell sets the GPU field of one cell. read says the cell is a
// temperature, power or clock reading; pid is the partition id the cell
// gives, -1 for none.
func rocmConciseCell(g *snapshot.GPU, col, v, header string) (read bool, pid int) {
	pid = -1
	if amdUnknown(v) {
		return false, pid
	}
	n, isNum := amdNum(v)
	switch {
	case strings.HasPrefix(col, "[model"):
		// The card's model (PCI subsystem device) id, not its device id:
		// an MI210 (device 0x740f) prints 0x0c34 here.
	case col == "node":
		if k, ok := amdInt(v); ok && k >= 0 && k <= rocmMaxIndex {
			g.KFDNodes = []int{k}
		}
	case col == "ids":
		// "(DID, GUID)": the PCI device id and KFD's GPU id.
		did, _, _ := strings.Cut(v, ",")
		if strings.HasPrefix(strings.ToLower(strings.TrimSpace(did)), "0x") {
			g.DeviceID = amdHexID(did)
		}
	case col == "temp" && isNum:
		read = true
		if strings.Contains(header, "Junction") {
			amdTemp(g).JunctionC = snapshot.Ptr(n)
		} else if strings.Contains(header, "Edge") {
			amdTemp(g).EdgeC = snapshot.Ptr(n)
		} else if strings.Contains(header, "Memory") {
			amdTemp(g).MemoryC = snapshot.Ptr(n)
		}
	case (col == "power" || col == "avgpwr") && isNum:
		read = true
		amdPower(g).DrawW = snapshot.Ptr(n)
	case col == "pwrcap" && isNum:
		amdPower(g).LimitW = snapshot.Ptr(n)
	case col == "partitions":
		part := &snapshot.Partition{}
		for _, x := range strings.Split(v, ",") {
			x = strings.ToUpper(strings.TrimSpace(x))
			switch {
			case strings.HasPrefix(x, "NPS"):
				part.Memory = x
			case strings.HasSuffix(x, "PX"):
				part.Compute = x
			default:
				if k, ok := amdInt(x); ok && k >= 0 && k <= rocmMaxIndex {
					pid = k
				}
			}
		}
		if part.Memory != "" || part.Compute != "" {
			g.Partition = part
		}
	case col == "sclk" && isNum:
		read = true
		amdClocks(g).GraphicsMHz = snapshot.Ptr(n)
	case col == "mclk" && isNum:
		read = true
		amdClocks(g).MemoryMHz = snapshot.Ptr(n)
	case col == "fan" && isNum:
		g.Fans = []snapshot.Fan{{Percent: snapshot.Ptr(n)}}
	case col == "perf":
		g.PerfLevel = strings.ToLower(v)
	case col == "vram%" && isNum:
		g.MemoryUsedPercent = snapshot.Ptr(n)
	case col == "gpu%" && isNum:
		g.UtilizationGPU = snapshot.Ptr(n)
	}
	return read, pid
}

// rocmTokens splits a concise-table line into cells: "[0x74a1 : 0x00]" is
// one cell, "NPS1, SPX" is one cell, and in a header "(annotations)" are
// dropped.
func rocmTokens(line string, header bool) []string {
	f := strings.Fields(line)
	var out []string
	for i := 0; i < len(f); i++ {
		t := f[i]
		switch {
		case strings.HasPrefix(t, "["):
			for !strings.HasSuffix(t, "]") && i+1 < len(f) {
				i++
				t += " " + f[i]
			}
		case header && strings.HasPrefix(t, "("):
			for !strings.HasSuffix(t, ")") && i+1 < len(f) {
				i++
			}
			continue
		case !header:
			for strings.HasSuffix(t, ",") && i+1 < len(f) {
				i++
				t += " " + f[i]
			}
		}
		out = append(out, t)
	}
	return out
}

// rocmHWKeys maps --showhw columns to the "Key: value" names rocmFill reads.
var rocmHWKeys = map[string]string{
	"NODE": "Node ID", "DID": "Device ID", "GFX VER": "GFX Version", "VBIOS": "VBIOS version",
	"BUS": "PCI Bus", "UMC RAS": "UMC RAS",
}

var rocmColGap = lazy(`\S+(?: \S+)*`)

// hwTable reads `rocm-smi --showhw` ("Concise Hardware Info"): "GPU DID
// GFX RAS SDMA RAS UMC RAS VBIOS BUS", and since 6.1 with NODE, GUID, GFX
// VER and PARTITION ID. Header names hold single spaces, columns are
// separated by two or more; values are cut at the header's column starts
// when splitting at spaces does not give one per column.
func (p *rocmTextParser) hwTable(lines []string) {
	var cols []string
	var starts []int
	for _, line := range lines {
		trim := strings.TrimSpace(line)
		if trim == "" {
			continue
		}
		if cols == nil {
			if strings.HasPrefix(trim, "GPU ") && strings.Contains(trim, "BUS") {
				for _, loc := range rocmColGap().FindAllStringIndex(line, -1) {
					cols = append(cols, line[loc[0]:loc[1]])
					starts = append(starts, loc[0])
				}
				continue
			}
			p.message(trim)
			continue
		}
		if trim[0] < '0' || trim[0] > '9' {
			p.message(trim)
			continue
		}
		vals := strings.Fields(trim)
		if len(vals) != len(cols) {
			vals = rocmCut(line, starts)
		}
		if len(vals) != len(cols) {
			p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi",
				Message: "hardware table row does not match its header: " + trim})
			continue
		}
		i, err := strconv.Atoi(vals[0])
		if err != nil || i < 0 || i > rocmMaxIndex {
			continue
		}
		if p.kv[i] == nil {
			p.kv[i] = map[string]string{}
		}
		for c, name := range cols[1:] {
			v := vals[c+1]
			if name == "PARTITION ID" {
				if k, ok := amdInt(v); ok && k >= 0 && k <= rocmMaxIndex {
					p.partID[i] = k
				}
				continue
			}
			if k := rocmHWKeys[name]; k != "" {
				p.kv[i][k] = v
			}
		}
		p.gpu(i)
	}
}

// rocmCut cuts a row at the given column starts.
func rocmCut(line string, starts []int) []string {
	var out []string
	for i, st := range starts {
		if st >= len(line) {
			out = append(out, "")
			continue
		}
		end := len(line)
		if i+1 < len(starts) && starts[i+1] < end {
			end = starts[i+1]
		}
		out = append(out, strings.TrimSpace(line[st:end]))
	}
	return out
}

// rocmIsInt says whether s is a decimal number (a row's device index).
func rocmIsInt(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
