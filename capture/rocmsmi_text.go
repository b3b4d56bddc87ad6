package capture

import (
	"bufio"
	"bytes"
	"errors"
	"regexp"
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
//   - the "Concise Info" table (plain `rocm-smi`), old and new column sets;
//   - "WARNING: ..." lines, kept as notes.

func rocmIsText(data []byte) bool {
	head := data
	if len(head) > 4096 {
		head = head[:4096]
	}
	return bytes.Contains(head, []byte("ROCm System Management Interface")) ||
		bytes.Contains(data, []byte("End of ROCm SMI Log"))
}

var (
	rocmTitle   = regexp.MustCompile(`^=+\s*(.*?)\s*=+$`)
	rocmGPULine = regexp.MustCompile(`^GPU\[(\d+)\]\s*:\s*(.*)$`)
	rocmMatName = regexp.MustCompile(`^GPU(\d+)$`)
)

type rocmTextParser struct {
	s       *snapshot.Snapshot
	kv      map[int]map[string]string
	topo    *rocmTopo
	concise map[int]*snapshot.GPU
	order   []int
	seen    map[int]bool
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
		if m := rocmTitle.FindStringSubmatch(trim); m != nil && strings.HasPrefix(trim, "==") {
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
	if len(p.s.GPUs) == 0 && p.s.Drivers.AMDGPU == "" && p.s.Drivers.ROCm == "" {
		return nil, errors.New("rocm-smi text: no GPU line, topology matrix or concise table found")
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
	}
	for _, line := range lines {
		trim := strings.TrimSpace(line)
		switch {
		case trim == "":
		case strings.HasPrefix(trim, "WARNING:") || strings.HasPrefix(trim, "ERROR:"):
			p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi", Message: trim})
		case rocmGPULine.MatchString(trim):
			m := rocmGPULine.FindStringSubmatch(trim)
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
			for _, name := range f {
				m := rocmMatName.FindStringSubmatch(name)
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
		m := rocmMatName.FindStringSubmatch(f[0])
		if m == nil {
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

// conciseTable reads the default table. The first header line names the
// columns ("Device [Model : Revision] Temp Power Partitions SCLK MCLK Fan
// Perf PwrCap VRAM% GPU%", or the older "GPU Temp (DieEdge) AvgPwr SCLK
// ..."); a second header line may annotate them ("(Junction)"). Rows start
// with the device number; an indented line after a row is its name.
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
			cols = rocmTokens(trim, true)
			header = trim
			continue
		}
		if trim[0] < '0' || trim[0] > '9' {
			if last != nil && strings.HasPrefix(line, " ") && last.Model == "" {
				last.Model = trim
			} else if last == nil {
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
		if err != nil || i > rocmMaxIndex {
			continue
		}
		g := &snapshot.GPU{Index: i, Vendor: snapshot.VendorAMD, MatrixName: "GPU" + strconv.Itoa(i)}
		for c, name := range cols[1:] {
			rocmConciseCell(g, strings.ToLower(name), vals[c+1], header)
		}
		p.concise[i] = g
		p.gpu(i)
		last = g
	}
}

func rocmConciseCell(g *snapshot.GPU, col, v, header string) {
	if amdUnknown(v) {
		return
	}
	n, isNum := amdNum(v)
	switch {
	case strings.HasPrefix(col, "[model"):
		id, _, _ := strings.Cut(strings.Trim(v, "[]"), ":")
		g.DeviceID = amdHexID(id)
	case col == "temp" && isNum:
		if strings.Contains(header, "Junction") {
			amdTemp(g).JunctionC = snapshot.Ptr(n)
		} else if strings.Contains(header, "Edge") {
			amdTemp(g).EdgeC = snapshot.Ptr(n)
		} else if strings.Contains(header, "Memory") {
			amdTemp(g).MemoryC = snapshot.Ptr(n)
		}
	case (col == "power" || col == "avgpwr") && isNum:
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
			}
		}
		if part.Memory != "" || part.Compute != "" {
			g.Partition = part
		}
	case col == "sclk" && isNum:
		amdClocks(g).GraphicsMHz = snapshot.Ptr(n)
	case col == "mclk" && isNum:
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
