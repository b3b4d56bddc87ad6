package capture

// nvidia-smi -q (text): the "==============NVSMI LOG==============" report,
// in full or limited to sections (-d PERFORMANCE). Old drivers spell some
// sections differently ("Ecc Mode", "Clocks Throttle Reasons"); keys are
// matched without regard to case and both spellings are read.

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

const kindNvsmiQ = "nvidia-smi-q"

func init() {
	RegisterFile(FileImporter{
		Kind:   kindNvsmiQ,
		Detect: detectNvsmiQ,
		Parse:  func(_ string, data []byte) (*snapshot.Snapshot, error) { return ParseNvidiaSMIQ(data) },
	})
}

func detectNvsmiQ(_ string, data []byte) bool {
	return bytes.Contains(data, []byte("NVSMI LOG==")) && !bytes.Contains(data, []byte("<nvidia_smi_log"))
}

// nvsmiNode is one line of the -q report with the lines indented under it.
type nvsmiNode struct {
	key    string // as printed
	lkey   string // lower case, for lookups
	val    string
	hasVal bool
	line   int
	indent int
	kids   []*nvsmiNode
}

// child returns the first child whose key is one of keys (lower case).
func (n *nvsmiNode) child(keys ...string) *nvsmiNode {
	if n == nil {
		return nil
	}
	for _, k := range n.kids {
		for _, want := range keys {
			if k.lkey == want {
				return k
			}
		}
	}
	return nil
}

// at follows a path of keys; each step may list alternatives split by "|".
func (n *nvsmiNode) at(path ...string) *nvsmiNode {
	for _, p := range path {
		n = n.child(strings.Split(p, "|")...)
		if n == nil {
			return nil
		}
	}
	return n
}

// v is the value at path, or an absent value.
func (n *nvsmiNode) v(path ...string) nvVal {
	c := n.at(path...)
	if c == nil || !c.hasVal {
		return nvVal{}
	}
	return nvVal{s: c.val, at: fmt.Sprintf("line %d (%s)", c.line, c.key)}
}

// walk calls f for every node under n, depth first.
func (n *nvsmiNode) walk(f func(*nvsmiNode)) {
	if n == nil {
		return
	}
	for _, k := range n.kids {
		f(k)
		k.walk(f)
	}
}

// splitNvsmiLine splits "    Key      : value" into its parts.
func splitNvsmiLine(s string) (key, val string, hasVal bool) {
	if i := strings.Index(s, " :"); i >= 0 {
		return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+2:]), true
	}
	if strings.HasSuffix(s, ":") {
		return strings.TrimSpace(strings.TrimSuffix(s, ":")), "", true
	}
	if i := strings.Index(s, ": "); i >= 0 {
		return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+2:]), true
	}
	return strings.TrimSpace(s), "", false
}

// parseNvsmiTree reads the report into a tree by indentation. Lines that
// are not part of the report (WARNING lines, the log banner) are returned
// apart.
func parseNvsmiTree(data []byte) (root *nvsmiNode, warnings []string, banners int) {
	root = &nvsmiNode{indent: -1}
	stack := []*nvsmiNode{root}
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimRight(raw, "\r \t")
		t := strings.TrimSpace(line)
		switch {
		case t == "":
			continue
		case strings.HasPrefix(t, "=="):
			if strings.Contains(t, "NVSMI LOG") {
				banners++
			}
			continue
		case nvsmiIsWarning(t):
			warnings = append(warnings, t)
			continue
		}
		indent := 0
		for _, r := range line {
			if r == ' ' {
				indent++
			} else if r == '\t' {
				indent += 4
			} else {
				break
			}
		}
		key, val, hasVal := splitNvsmiLine(t)
		n := &nvsmiNode{key: key, lkey: strings.ToLower(key), val: val, hasVal: hasVal, line: i + 1, indent: indent}
		for len(stack) > 1 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		parent := stack[len(stack)-1]
		parent.kids = append(parent.kids, n)
		stack = append(stack, n)
	}
	return root, warnings, banners
}

// ParseNvidiaSMIQ reads `nvidia-smi -q` text output: driver and CUDA
// versions, the attached-GPU count (as a Claim), and for every GPU section
// its identity, PCIe link, memory, power, clocks, temperatures, ECC and
// row-remapping state, clock-event reasons, MIG state and process count.
func ParseNvidiaSMIQ(data []byte) (*snapshot.Snapshot, error) {
	root, warnings, banners := parseNvsmiTree(data)
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{}
	notes := &nvsmiNotes{source: kindNvsmiQ}
	var raws []*nvRaw
	seen := map[string]int{}
	for _, n := range root.kids {
		if n.hasVal || !strings.HasPrefix(n.lkey, "gpu ") {
			continue
		}
		addr := strings.TrimSpace(n.key[4:])
		if _, err := snapshot.CanonicalPCI(addr); err != nil {
			return nil, fmt.Errorf("line %d: cannot read %q as a GPU section header (want \"GPU <PCI address>\"): %w", n.line, n.key, err)
		}
		r := nvsmiQRaw(n, addr)
		notes.gpu = ""
		g, err := r.build(len(s.GPUs), notes)
		if err != nil {
			return nil, err
		}
		if i, dup := seen[g.PCIAddress]; dup {
			// A file holding several reports (nvidia-smi -q -l): keep the last.
			g.Index = i
			s.GPUs[i] = g
			raws[i] = r
			continue
		}
		seen[g.PCIAddress] = len(s.GPUs)
		s.GPUs = append(s.GPUs, g)
		raws = append(raws, r)
		if ev, ok := nvsmiQErrors(n, g.PCIAddress); ok {
			s.Events = append(s.Events, ev)
		}
	}
	notes.gpu = ""
	driver, cuda := root.v("driver version"), root.v("cuda version")
	if banners == 0 && len(s.GPUs) == 0 && !driver.known() {
		return nil, errors.New("no nvidia-smi -q report found (no NVSMI LOG banner, no GPU sections)")
	}
	if banners > 1 {
		notes.add("the file holds %d nvidia-smi -q reports; for each GPU the last one is kept", banners)
	}
	nvsmiNodeLevel(s, kindNvsmiQ, driver, cuda, nvsmiLastTop(root, "attached gpus"), nvsmiLastTop(root, "timestamp"))
	s.Drivers.FabricManager = nvsmiFabric(raws)
	s.Notes = append(s.Notes, notes.notes...)
	nvsmiWarnings(s, kindNvsmiQ, warnings)
	s.Events = append(s.Events, scanToolErrors(data, kindNvsmiQ)...)
	return s, nil
}

// nvsmiQErrors: a GPU section whose values say the GPU is lost or needs a
// reset, or whose values are mostly "Unknown Error", is the report of a GPU
// the driver cannot talk to.
func nvsmiQErrors(n *nvsmiNode, addr string) (snapshot.Event, bool) {
	vals, unknown := 0, 0
	reason, what := "", ""
	var walk func(*nvsmiNode)
	walk = func(n *nvsmiNode) {
		for _, k := range n.kids {
			if k.hasVal {
				vals++
				l := strings.ToLower(k.val)
				switch {
				case strings.Contains(l, "gpu is lost"):
					reason, what = snapshot.ToolGPULost, k.key+": "+k.val
				case strings.Contains(l, "requires reset") && reason == "":
					reason, what = snapshot.ToolGPUError, k.key+": "+k.val
				case strings.Contains(l, "unknown error"):
					unknown++
				}
			}
			walk(k)
		}
	}
	walk(n)
	if reason == "" && (unknown < 5 || unknown*2 < vals) {
		return snapshot.Event{}, false
	}
	if reason == "" {
		reason = snapshot.ToolGPUError
		what = fmt.Sprintf("%d of %d values read \"Unknown Error\"", unknown, vals)
	}
	return snapshot.Event{Source: kindNvsmiQ, Kind: snapshot.EventToolError, Reason: reason, Device: addr,
		Message: "nvidia-smi -q for GPU " + addr + ": " + what}, true
}

// nvsmiLastTop is the last top-level value named key (files with several reports
// repeat it).
func nvsmiLastTop(root *nvsmiNode, key string) nvVal {
	var v nvVal
	for _, k := range root.kids {
		if k.lkey == key && k.hasVal {
			v = nvVal{s: k.val, at: fmt.Sprintf("line %d (%s)", k.line, k.key)}
		}
	}
	return v
}

// nvsmiQRaw gathers one GPU section's fields.
func nvsmiQRaw(g *nvsmiNode, addr string) *nvRaw {
	r := &nvRaw{busID: nvVal{s: addr, at: fmt.Sprintf("line %d (%s)", g.line, g.key)}}
	r.product = g.v("product name")
	r.arch = g.v("product architecture")
	r.deviceID = g.v("pci", "device id")
	r.subsysID = g.v("pci", "sub system id")
	r.uuid = g.v("gpu uuid")
	r.serial = g.v("serial number")
	r.boardPart = g.v("board part number")
	r.gpuPartAsBoard = g.v("gpu part number")
	r.vbios = g.v("vbios version")
	r.infoImage = g.v("inforom version", "image version")
	r.infoOEM = g.v("inforom version", "oem object")
	r.infoECC = g.v("inforom version", "ecc object")
	r.infoPwr = g.v("inforom version", "power management object")
	r.fbTotal = g.v("fb memory usage", "total")
	r.fbUsed = g.v("fb memory usage", "used")
	r.computeMode = g.v("compute mode")
	r.persistence = g.v("persistence mode")
	r.driverModel = g.v("driver model", "current")
	r.virtualization = g.v("gpu virtualization mode", "virtualization mode")
	r.pstate = g.v("performance state")
	r.utilGPU = g.v("utilization", "gpu")

	pw := g.at("gpu power readings|power readings")
	r.powerDraw = nvsmiFirstKnown(pw.v("power draw"), pw.v("average power draw"), pw.v("instantaneous power draw"))
	r.powerLimit = nvsmiFirstKnown(pw.v("current power limit"), pw.v("power limit"))
	r.powerEnforced = pw.v("enforced power limit")
	r.powerDefault = pw.v("default power limit")
	r.powerMin = pw.v("min power limit")
	r.powerMax = pw.v("max power limit")

	r.clkGraphics = g.v("clocks", "graphics")
	r.clkSM = g.v("clocks", "sm")
	r.clkMem = g.v("clocks", "memory")
	r.maxGraphics = g.v("max clocks", "graphics")
	r.maxSM = g.v("max clocks", "sm")
	r.maxMem = g.v("max clocks", "memory")

	// "T.Limit" temperatures are margins to a limit, not thresholds; they
	// are not read as thresholds.
	r.tempGPU = g.v("temperature", "gpu current temp")
	r.tempMem = g.v("temperature", "memory current temp")
	r.tempShutdown = g.v("temperature", "gpu shutdown temp")
	r.tempSlowdown = g.v("temperature", "gpu slowdown temp")
	r.tempMaxOp = g.v("temperature", "gpu max operating temp")
	r.tempMemMax = g.v("temperature", "memory max operating temp")

	for _, k := range g.kids {
		if k.lkey == "fan speed" && k.hasVal {
			r.fans = append(r.fans, nvVal{s: k.val, at: fmt.Sprintf("line %d (%s)", k.line, k.key)})
		}
	}

	if em := g.at("ecc mode"); em != nil {
		r.eccSeen = true
		r.eccCurrent = em.v("current")
		r.eccPending = em.v("pending")
		if em.hasVal && em.val != "" {
			r.eccCurrent = g.v("ecc mode")
		}
	}
	if ee := g.at("ecc errors"); ee != nil {
		r.eccSeen = true
		r.eccVolCorr, r.eccVolUnc = nvsmiQECC(ee.at("volatile"))
		r.eccAggCorr, r.eccAggUnc = nvsmiQECC(ee.at("aggregate"))
	}
	r.retiredSBE = g.v("retired pages", "single bit ecc")
	r.retiredDBE = g.v("retired pages", "double bit ecc")
	r.retiredPending = nvsmiFirstPresent(g.v("retired pages", "pending page blacklist"), g.v("retired pages", "pending page retirement"))
	r.remapCorr = g.v("remapped rows", "correctable error")
	r.remapUnc = g.v("remapped rows", "uncorrectable error")
	r.remapPending = g.v("remapped rows", "pending")
	r.remapFailure = g.v("remapped rows", "remapping failure occurred")

	g.at("clocks event reasons|clocks throttle reasons").walk(func(n *nvsmiNode) {
		if n.hasVal {
			r.reasons = append(r.reasons, nvReason{label: n.key, value: nvVal{s: n.val, at: fmt.Sprintf("line %d (%s)", n.line, n.key)}})
		}
	})
	g.at("clocks event reasons counters|clocks throttle reasons counters").walk(func(n *nvsmiNode) {
		if n.hasVal {
			r.counters = append(r.counters, nvReason{label: n.key, value: nvVal{s: n.val, at: fmt.Sprintf("line %d (%s)", n.line, n.key)}})
		}
	})

	gen := g.at("pci", "gpu link info", "pcie generation")
	r.genMax = gen.v("max")
	r.genCur = gen.v("current")
	r.genDevMax = gen.v("device max")
	r.genDevCur = gen.v("device current")
	r.genHostMax = gen.v("host max")
	r.widthMax = g.v("pci", "gpu link info", "link width", "max")
	r.widthCur = g.v("pci", "gpu link info", "link width", "current")
	r.replays = g.v("pci", "replays since reset")
	r.rollovers = g.v("pci", "replay number rollovers")
	r.txUtil = g.v("pci", "tx throughput")
	r.rxUtil = g.v("pci", "rx throughput")

	r.migCurrent = g.v("mig mode", "current")
	r.migPending = g.v("mig mode", "pending")
	for _, d := range nvsmiKids(g.at("mig devices")) {
		if len(d.kids) == 0 {
			continue
		}
		r.migDevices = append(r.migDevices, nvMIG{
			gi:       d.v("gpu instance id"),
			ci:       d.v("compute instance id"),
			sms:      d.v("device attributes", "shared", "multiprocessor count"),
			memTotal: d.v("fb memory usage", "total"),
			uuid:     nvsmiFirstPresent(d.v("mig uuid"), d.v("uuid")),
		})
	}

	r.fabricState = g.v("fabric", "state")
	r.fabricStatus = g.v("fabric", "status")

	if p := g.at("processes"); p != nil && (p.val == "None" || len(p.kids) > 0) {
		r.processesRead = true // "N/A" or an error says nothing
	}
	g.at("processes").walk(func(n *nvsmiNode) {
		if n.lkey == "process id" {
			r.processes++
		}
	})
	return r
}

func nvsmiKids(n *nvsmiNode) []*nvsmiNode {
	if n == nil {
		return nil
	}
	return n.kids
}

// nvsmiQECC lists the counters that add up to the correctable and
// uncorrectable totals of one ECC section (Volatile or Aggregate), in both
// the SRAM/DRAM layout (Ampere and later) and the Single/Double Bit layout.
func nvsmiQECC(sec *nvsmiNode) (corr, unc []nvVal) {
	if sec == nil {
		return nil, nil
	}
	for _, k := range []string{"sram correctable", "dram correctable"} {
		if v := sec.v(k); v.at != "" {
			corr = append(corr, v)
		}
	}
	for _, k := range []string{"sram uncorrectable", "sram uncorrectable parity", "sram uncorrectable sec-ded", "dram uncorrectable"} {
		if v := sec.v(k); v.at != "" {
			unc = append(unc, v)
		}
	}
	if v := sec.v("single bit", "total"); v.at != "" {
		corr = append(corr, v)
	}
	if v := sec.v("double bit", "total"); v.at != "" {
		unc = append(unc, v)
	}
	return corr, unc
}

// nvsmiFirstKnown returns the first value that holds a value; else the first
// present one, so that "N/A" is still seen as present.
func nvsmiFirstKnown(vs ...nvVal) nvVal {
	for _, v := range vs {
		if v.known() {
			return v
		}
	}
	return nvsmiFirstPresent(vs...)
}

func nvsmiFirstPresent(vs ...nvVal) nvVal {
	for _, v := range vs {
		if v.at != "" {
			return v
		}
	}
	return nvVal{}
}
