package capture

// Shared pieces of the three nvidia-smi importers (nvidia-smi -q text,
// nvidia-smi -q -x XML, the plain nvidia-smi table): reading nvidia-smi's
// value forms ("71.97 W", "16x", "N/A", "0x233010DE") and turning the raw
// per-GPU fields both -q forms share into a snapshot.GPU.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"kiln.dev/kiln/snapshot"
)

// nvVal is one raw value as printed, with where it was read ("line 312" or
// "<max_link_gen>") so that a value kiln cannot read can be reported.
type nvVal struct {
	s  string
	at string
}

func (v nvVal) known() bool { return !nvsmiUnknown(v.s) }

// nvsmiUnknown reports whether nvidia-smi printed "no value" rather than a
// value: N/A, [N/A], Not Supported, a bracketed error, or a deprecation text.
func nvsmiUnknown(s string) bool {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "n/a", "not supported", "unknown", "unknown error",
		"not available", "insufficient permissions", "not found",
		"requested functionality has been deprecated",
		"gpu access blocked by the operating system":
		return true
	}
	return strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]")
}

// nvsmiNotes collects value-level problems. A capture with one odd value is
// still worth auditing, so such problems become Notes, not errors.
type nvsmiNotes struct {
	source string
	gpu    string
	notes  []snapshot.Note
}

func (n *nvsmiNotes) add(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if n.gpu != "" {
		msg = "GPU " + n.gpu + ": " + msg
	}
	n.notes = append(n.notes, snapshot.Note{Source: n.source, Message: msg})
}

func (n *nvsmiNotes) bad(v nvVal, what string) {
	if v.at != "" {
		n.add("%s: cannot read %q as %s", v.at, v.s, what)
		return
	}
	n.add("cannot read %q as %s", v.s, what)
}

// number reads "71.97 W", "345 MHz", "36 C", "0 %", "632 KB/s": a number
// followed by one of the given units (or none). Unknown values give nil.
func (n *nvsmiNotes) number(v nvVal, what string, units ...string) *float64 {
	if !v.known() {
		return nil
	}
	t := strings.TrimSpace(v.s)
	for _, u := range units {
		if s, ok := strings.CutSuffix(t, u); ok {
			t = strings.TrimSpace(s)
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f != f || f > 1e18 || f < -1e18 {
		n.bad(v, what)
		return nil
	}
	return &f
}

// count reads a non-negative integer counter ("120", "0").
func (n *nvsmiNotes) count(v nvVal, what string) *uint64 {
	if !v.known() {
		return nil
	}
	t := strings.TrimSpace(v.s)
	t = strings.TrimSpace(strings.TrimSuffix(t, "us"))
	u, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		n.bad(v, what)
		return nil
	}
	return &u
}

// bytes reads a memory size ("81559 MiB") into bytes.
func (n *nvsmiNotes) bytes(v nvVal, what string) *uint64 {
	if !v.known() {
		return nil
	}
	t := strings.TrimSpace(v.s)
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if s, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(s), u.mult
			break
		}
	}
	x, err := strconv.ParseUint(t, 10, 64)
	if err != nil || x > (1<<64-1)/mult {
		n.bad(v, what)
		return nil
	}
	x *= mult
	return &x
}

// flag reads Enabled/Disabled, Yes/No, On/Off, Active/Not Active.
func (n *nvsmiNotes) flag(v nvVal, what string) *bool {
	if !v.known() {
		return nil
	}
	switch strings.ToLower(strings.TrimSpace(v.s)) {
	case "enabled", "yes", "on", "active", "true":
		return snapshot.Ptr(true)
	case "disabled", "no", "off", "not active", "false":
		return snapshot.Ptr(false)
	}
	n.bad(v, what)
	return nil
}

// integer reads a small non-negative integer (PCIe generation, an instance id).
func (n *nvsmiNotes) integer(v nvVal, what string, suffix string) (int, bool) {
	if !v.known() {
		return 0, false
	}
	t := strings.TrimSpace(v.s)
	if suffix != "" {
		t = strings.TrimSpace(strings.TrimSuffix(t, suffix))
	}
	x, err := strconv.Atoi(t)
	if err != nil || x < 0 || x > 1<<20 {
		n.bad(v, what)
		return 0, false
	}
	return x, true
}

// text returns a value as printed, or "" when nvidia-smi printed no value.
func nvsmiText(v nvVal) string {
	if !v.known() {
		return ""
	}
	return strings.TrimSpace(v.s)
}

// pciIDs splits nvidia-smi's 32-bit PCI ids: "0x233010DE" is device 0x2330
// of vendor 0x10de; a subsystem id "0x16C110DE" is subsystem device 0x16c1 of
// subsystem vendor 0x10de, written "10de:16c1".
func (n *nvsmiNotes) pciID(v nvVal, what string) (hi, lo string, ok bool) {
	if !v.known() {
		return "", "", false
	}
	t := strings.ToLower(strings.TrimSpace(v.s))
	t = strings.TrimPrefix(t, "0x")
	x, err := strconv.ParseUint(t, 16, 32)
	if err != nil || len(t) > 8 {
		n.bad(v, what)
		return "", "", false
	}
	if x>>16 == 0 || x&0xffff == 0 {
		// Captures sanitised before publication print "000000DE".
		n.add("%s: %q is not a usable %s (a zero half: a placeholder?); left unknown", v.at, v.s, what[2:])
		return "", "", false
	}
	return fmt.Sprintf("%04x", x>>16), fmt.Sprintf("%04x", x&0xffff), true
}

// nvsmiReasonNames maps nvidia-smi's clock-event (throttle) reason labels
// and XML tag suffixes to kiln's snake_case names.
var nvsmiReasonNames = map[string]string{
	"idle":                        "idle",
	"gpu idle":                    "idle",
	"gpu_idle":                    "idle",
	"applications clocks setting": "applications_clocks_setting",
	"applications_clocks_setting": "applications_clocks_setting",
	"sw power cap":                "sw_power_cap",
	"sw_power_cap":                "sw_power_cap",
	"hw slowdown":                 "hw_slowdown",
	"hw_slowdown":                 "hw_slowdown",
	"hw thermal slowdown":         "hw_thermal_slowdown",
	"hw_thermal_slowdown":         "hw_thermal_slowdown",
	"hw power brake slowdown":     "hw_power_brake_slowdown",
	"hw_power_brake_slowdown":     "hw_power_brake_slowdown",
	"sync boost":                  "sync_boost",
	"sync_boost":                  "sync_boost",
	"sw thermal slowdown":         "sw_thermal_slowdown",
	"sw_thermal_slowdown":         "sw_thermal_slowdown",
	"display clock setting":       "display_clock_setting",
	"display_clocks_setting":      "display_clock_setting",
	"display_clock_setting":       "display_clock_setting",
	// Counter names ("Clocks Event Reasons Counters" and its XML form).
	"sw power capping":   "sw_power_cap",
	"hw power braking":   "hw_power_brake_slowdown",
	"hw_power_brake":     "hw_power_brake_slowdown",
	"sw_therm_slowdown":  "sw_thermal_slowdown",
	"hw_therm_slowdown":  "hw_thermal_slowdown",
	"sw thermal capping": "sw_thermal_slowdown",
}

var nvsmiNonWord = lazy(`[^a-z0-9]+`)

// nvsmiReasonName normalises a reason label; labels kiln does not know yet
// are kept in snake_case so that they are still reported.
func nvsmiReasonName(label string) string {
	l := strings.ToLower(strings.TrimSpace(label))
	if n, ok := nvsmiReasonNames[l]; ok {
		return n
	}
	return strings.Trim(nvsmiNonWord().ReplaceAllString(l, "_"), "_")
}

// nvRaw is one GPU's fields as nvidia-smi prints them, gathered by the -q
// text or XML reader and turned into a snapshot.GPU by build.
type nvRaw struct {
	busID                                   nvVal
	product, arch                           nvVal
	deviceID, subsysID                      nvVal
	uuid, serial, boardPart, gpuPartAsBoard nvVal
	vbios                                   nvVal
	infoImage, infoOEM, infoECC, infoPwr    nvVal
	fbTotal, fbUsed                         nvVal
	computeMode, persistence, driverModel   nvVal
	virtualization, pstate, utilGPU         nvVal
	powerDraw, powerLimit, powerEnforced    nvVal
	powerDefault, powerMin, powerMax        nvVal
	clkGraphics, clkSM, clkMem              nvVal
	maxGraphics, maxSM, maxMem              nvVal
	tempGPU, tempMem, tempShutdown          nvVal
	tempSlowdown, tempMaxOp, tempMemMax     nvVal
	fans                                    []nvVal
	eccSeen                                 bool
	eccCurrent, eccPending                  nvVal
	eccVolCorr, eccVolUnc                   []nvVal
	eccAggCorr, eccAggUnc                   []nvVal
	retiredSBE, retiredDBE, retiredPending  nvVal
	remapCorr, remapUnc                     nvVal
	remapPending, remapFailure              nvVal
	reasons                                 []nvReason
	counters                                []nvReason
	genMax, genCur, genDevMax, genDevCur    nvVal
	genHostMax, widthMax, widthCur          nvVal
	replays, rollovers, txUtil, rxUtil      nvVal
	migCurrent, migPending                  nvVal
	migDevices                              []nvMIG
	fabricState, fabricStatus               nvVal
	processes                               int
	processesRead                           bool // the Processes section was there, "None" included
}

type nvReason struct {
	label string
	value nvVal
}

type nvMIG struct {
	gi, ci, sms, memTotal, uuid nvVal
}

// build turns the raw fields into a GPU. Values it cannot read are left
// unknown and reported through notes.
func (r *nvRaw) build(index int, notes *nvsmiNotes) (snapshot.GPU, error) {
	g := snapshot.GPU{Index: index, Vendor: snapshot.VendorNVIDIA}
	if r.busID.known() {
		a, err := snapshot.CanonicalPCI(r.busID.s)
		if err != nil {
			return g, fmt.Errorf("%s: cannot read %q as a PCI address: %w", r.busID.at, r.busID.s, err)
		}
		g.PCIAddress = a
		notes.gpu = a
	}
	g.Model = nvsmiText(r.product)
	g.Architecture = nvsmiText(r.arch)
	if dev, ven, ok := notes.pciID(r.deviceID, "a PCI device id"); ok {
		if ven == "10de" {
			g.DeviceID = dev
		} else {
			notes.add("%s: %q does not hold NVIDIA's vendor id 10de; device id left unknown", r.deviceID.at, r.deviceID.s)
		}
	}
	if sdev, sven, ok := notes.pciID(r.subsysID, "a PCI subsystem id"); ok {
		g.SubsystemID = sven + ":" + sdev
	}
	g.UUID = nvsmiText(r.uuid)
	g.Serial = nvsmiText(r.serial)
	g.BoardPart = nvsmiText(r.boardPart)
	if g.BoardPart == "" && r.boardPart.at == "" {
		// Drivers before the "Board Part Number" field printed the board's
		// part number (692-...) as "GPU Part Number".
		g.BoardPart = nvsmiText(r.gpuPartAsBoard)
	}
	g.VBIOS = nvsmiText(r.vbios)
	if ir := (snapshot.InfoROM{Image: nvsmiText(r.infoImage), OEM: nvsmiText(r.infoOEM), ECC: nvsmiText(r.infoECC), Power: nvsmiText(r.infoPwr)}); ir != (snapshot.InfoROM{}) {
		g.InfoROM = &ir
	}
	if b := notes.bytes(r.fbTotal, "a memory size"); b != nil {
		g.MemoryTotalBytes = *b
	}
	if b := notes.bytes(r.fbUsed, "a memory size"); b != nil {
		g.MemoryUsedBytes = *b
	}
	g.ComputeMode = nvsmiText(r.computeMode)
	g.Persistence = notes.flag(r.persistence, "a persistence mode")
	g.DriverModel = nvsmiText(r.driverModel)
	g.Virtualization = nvsmiText(r.virtualization)
	g.PerformanceState = nvsmiText(r.pstate)
	g.UtilizationGPU = notes.number(r.utilGPU, "a utilization", "%")

	p := snapshot.Power{
		DrawW:         notes.number(r.powerDraw, "a power draw", "W"),
		LimitW:        notes.number(r.powerLimit, "a power limit", "W"),
		EnforcedW:     notes.number(r.powerEnforced, "a power limit", "W"),
		DefaultLimitW: notes.number(r.powerDefault, "a power limit", "W"),
		MinLimitW:     notes.number(r.powerMin, "a power limit", "W"),
		MaxLimitW:     notes.number(r.powerMax, "a power limit", "W"),
	}
	if p != (snapshot.Power{}) {
		g.Power = &p
	}
	c := snapshot.Clocks{
		GraphicsMHz:    notes.number(r.clkGraphics, "a clock", "MHz"),
		SMMHz:          notes.number(r.clkSM, "a clock", "MHz"),
		MemoryMHz:      notes.number(r.clkMem, "a clock", "MHz"),
		MaxGraphicsMHz: notes.number(r.maxGraphics, "a clock", "MHz"),
		MaxSMMHz:       notes.number(r.maxSM, "a clock", "MHz"),
		MaxMemoryMHz:   notes.number(r.maxMem, "a clock", "MHz"),
	}
	if c != (snapshot.Clocks{}) {
		g.Clocks = &c
	}
	t := snapshot.Temperature{
		GPUC:      notes.number(r.tempGPU, "a temperature", "C"),
		MemoryC:   notes.number(r.tempMem, "a temperature", "C"),
		ShutdownC: notes.number(r.tempShutdown, "a temperature", "C"),
		SlowdownC: notes.number(r.tempSlowdown, "a temperature", "C"),
		MaxOpC:    notes.number(r.tempMaxOp, "a temperature", "C"),
		MemMaxC:   notes.number(r.tempMemMax, "a temperature", "C"),
	}
	if t != (snapshot.Temperature{}) {
		g.Temperature = &t
	}
	for _, f := range r.fans {
		if !f.known() {
			continue
		}
		if pct := notes.number(f, "a fan speed", "%"); pct != nil {
			g.Fans = append(g.Fans, snapshot.Fan{Percent: pct})
		} else {
			g.Fans = append(g.Fans, snapshot.Fan{Error: strings.TrimSpace(f.s)})
		}
	}
	g.ECC = r.buildECC(notes)
	if rp := (snapshot.RetiredPages{
		SingleBit: notes.count(r.retiredSBE, "a retired-page count"),
		DoubleBit: notes.count(r.retiredDBE, "a retired-page count"),
		Pending:   notes.flag(r.retiredPending, "a yes/no"),
	}); rp != (snapshot.RetiredPages{}) {
		g.RetiredPages = &rp
	}
	if rr := (snapshot.RemappedRows{
		Correctable:   notes.count(r.remapCorr, "a remapped-row count"),
		Uncorrectable: notes.count(r.remapUnc, "a remapped-row count"),
		Pending:       notes.flag(r.remapPending, "a yes/no"),
		Failure:       notes.flag(r.remapFailure, "a yes/no"),
	}); rr != (snapshot.RemappedRows{}) {
		g.RemappedRows = &rr
	}
	g.Throttle = r.buildThrottle(notes)
	g.PCIe = r.buildPCIe(notes)
	g.MIG = r.buildMIG(notes)
	g.Processes, g.ProcessesRead = r.processes, r.processesRead
	return g, nil
}

func (r *nvRaw) buildECC(notes *nvsmiNotes) *snapshot.ECC {
	if !r.eccSeen {
		return nil
	}
	e := snapshot.ECC{
		Enabled: notes.flag(r.eccCurrent, "an ECC mode"),
		Pending: notes.flag(r.eccPending, "an ECC mode"),
	}
	switch {
	case e.Enabled != nil:
		// A GPU without ECC has no mode to report.
		e.Supported = snapshot.Ptr(true)
	case !r.eccCurrent.known() && r.eccCurrent.at != "":
		e.Supported = snapshot.Ptr(false)
	}
	e.VolatileCorrectable = sumCounts(notes, r.eccVolCorr)
	e.VolatileUncorrectable = sumCounts(notes, r.eccVolUnc)
	e.AggregateCorrectable = sumCounts(notes, r.eccAggCorr)
	e.AggregateUncorrectable = sumCounts(notes, r.eccAggUnc)
	if e == (snapshot.ECC{}) {
		return nil
	}
	return &e
}

// sumCounts adds the counters that are known; nil when none is.
func sumCounts(notes *nvsmiNotes, vs []nvVal) *uint64 {
	var sum *uint64
	for _, v := range vs {
		c := notes.count(v, "an ECC error count")
		if c == nil {
			continue
		}
		if sum == nil {
			sum = new(uint64)
		}
		if *sum+*c < *sum {
			*sum = 1<<64 - 1
			continue
		}
		*sum += *c
	}
	return sum
}

// buildThrottle records every reason as read; a child reason (HW Power
// Brake Slowdown) is never derived from its parent (HW Slowdown) or the
// other way round.
func (r *nvRaw) buildThrottle(notes *nvsmiNotes) []snapshot.ThrottleReason {
	var out []snapshot.ThrottleReason
	idx := map[string]int{}
	for _, rs := range r.reasons {
		act := notes.flag(rs.value, "Active or Not Active")
		if act == nil {
			continue
		}
		name := nvsmiReasonName(rs.label)
		if name == "" {
			continue
		}
		if i, dup := idx[name]; dup {
			out[i].Active = *act
			continue
		}
		idx[name] = len(out)
		out = append(out, snapshot.ThrottleReason{Name: name, Active: *act})
	}
	for _, c := range r.counters {
		us := notes.count(c.value, "a time in microseconds")
		if us == nil {
			continue
		}
		if i, ok := idx[nvsmiReasonName(c.label)]; ok {
			out[i].Microseconds = us
		}
	}
	return out
}

func (r *nvRaw) buildPCIe(notes *nvsmiNotes) *snapshot.PCIeLink {
	var l snapshot.PCIeLink
	gen := func(vs ...nvVal) int {
		for _, v := range vs {
			if x, ok := notes.integer(v, "a PCIe generation", ""); ok && x >= 1 && x <= 16 {
				return x
			} else if ok {
				notes.bad(v, "a PCIe generation")
			}
		}
		return 0
	}
	width := func(v nvVal) int {
		if x, ok := notes.integer(v, "a PCIe link width", "x"); ok && x >= 1 && x <= 64 {
			return x
		} else if ok {
			notes.bad(v, "a PCIe link width")
		}
		return 0
	}
	// "Device Max" is the GPU's own maximum; older drivers print only "Max".
	l.MaxGen = gen(r.genDevMax, r.genMax)
	l.CurrentGen = gen(r.genCur, r.genDevCur)
	l.HostMaxGen = gen(r.genHostMax)
	l.MaxWidth = width(r.widthMax)
	l.CurrentWidth = width(r.widthCur)
	l.Replays = notes.count(r.replays, "a replay count")
	l.ReplayRollovers = notes.count(r.rollovers, "a replay rollover count")
	l.TxKBps = notes.number(r.txUtil, "a throughput", "KB/s")
	l.RxKBps = notes.number(r.rxUtil, "a throughput", "KB/s")
	if l == (snapshot.PCIeLink{}) {
		return nil
	}
	return &l
}

func (r *nvRaw) buildMIG(notes *nvsmiNotes) *snapshot.MIG {
	cur := notes.flag(r.migCurrent, "a MIG mode")
	pend := notes.flag(r.migPending, "a MIG mode")
	if cur == nil && pend == nil && len(r.migDevices) == 0 {
		return nil
	}
	m := &snapshot.MIG{PendingEnabled: pend}
	if cur != nil {
		m.Enabled = *cur
	} else if len(r.migDevices) > 0 {
		m.Enabled = true
	}
	for _, d := range r.migDevices {
		var in snapshot.MIGInstance
		gi, ok1 := notes.integer(d.gi, "a GPU instance id", "")
		ci, ok2 := notes.integer(d.ci, "a compute instance id", "")
		if !ok1 || !ok2 {
			notes.add("MIG device without readable GPU/compute instance ids skipped")
			continue
		}
		in.GPUInstance, in.ComputeInstance = gi, ci
		if sms, ok := notes.integer(d.sms, "a multiprocessor count", ""); ok {
			in.SMs = sms
		}
		if b := notes.bytes(d.memTotal, "a memory size"); b != nil {
			in.MemoryBytes = *b
		}
		in.UUID = nvsmiText(d.uuid)
		m.Instances = append(m.Instances, in)
	}
	return m
}

// nvsmiFabric picks the node's fabric state from the GPUs' reports: a GPU
// that is not "Completed"/"Success" wins, so that a problem is not hidden.
func nvsmiFabric(raws []*nvRaw) *snapshot.FabricManager {
	var fm *snapshot.FabricManager
	for _, r := range raws {
		st, ss := nvsmiText(r.fabricState), nvsmiText(r.fabricStatus)
		if st == "" && ss == "" {
			continue
		}
		healthy := strings.EqualFold(st, "Completed") && (ss == "" || strings.EqualFold(ss, "Success"))
		if fm == nil || !healthy {
			fm = &snapshot.FabricManager{State: st, Status: ss}
			if !healthy {
				break
			}
		}
	}
	return fm
}

var nvsmiInfoROMWarning = lazy(`(?i)WARNING:\s*infoROM is corrupted at gpu\s+([0-9a-fA-F:.]+)`)

// nvsmiWarnings turns the WARNING lines nvidia-smi prints around its output
// into notes, and marks the InfoROM of GPUs it reports as corrupted invalid.
func nvsmiWarnings(s *snapshot.Snapshot, source string, lines []string) {
	for _, ln := range lines {
		ln = strings.TrimSpace(ln)
		if !nvsmiIsWarning(ln) {
			continue
		}
		s.Notes = append(s.Notes, snapshot.Note{Source: source, Message: ln})
		m := nvsmiInfoROMWarning().FindStringSubmatch(ln)
		if m == nil {
			continue
		}
		addr, err := snapshot.CanonicalPCI(m[1])
		if err != nil {
			continue
		}
		if g := s.GPUByPCI(addr); g != nil {
			if g.InfoROM == nil {
				g.InfoROM = &snapshot.InfoROM{}
			}
			g.InfoROM.Valid = snapshot.Ptr(false)
		}
	}
}

// nvsmiTime reads nvidia-smi's timestamp ("Fri Jun 21 02:03:08 2024"). The
// tool prints the machine's local time without a zone; it is kept as UTC.
func nvsmiTime(s string) (time.Time, bool) {
	t := strings.Join(strings.Fields(s), " ")
	for _, layout := range []string{"Mon Jan 2 15:04:05 2006", time.ANSIC, time.UnixDate} {
		if ts, err := time.Parse(layout, t); err == nil {
			return ts, true
		}
	}
	return time.Time{}, false
}

// nvsmiNodeLevel fills what nvidia-smi says about the whole node.
func nvsmiNodeLevel(s *snapshot.Snapshot, source string, driver, cuda, attached, timestamp nvVal) {
	s.Drivers.NVIDIAUser = nvsmiText(driver)
	s.Drivers.CUDADriver = nvsmiText(cuda)
	if ts, ok := nvsmiTime(timestamp.s); ok {
		s.CollectedAt = ts
	}
	if attached.known() {
		if n, err := strconv.Atoi(strings.TrimSpace(attached.s)); err == nil && n >= 0 {
			s.Claims = append(s.Claims, snapshot.Claim{Source: source, What: "gpus", Count: n, Detail: attachedDetail(source)})
			if n != len(s.GPUs) {
				s.Notes = append(s.Notes, snapshot.Note{Source: source, Message: fmt.Sprintf(
					"the capture states %d attached GPUs but holds %d; only the GPUs it holds are listed", n, len(s.GPUs))})
			}
		}
	}
}

func attachedDetail(source string) string {
	if source == kindNvsmiXML {
		return "attached_gpus"
	}
	return "Attached GPUs"
}

// nvsmiIsWarning reports whether a trimmed line is a warning nvidia-smi
// printed around its report.
func nvsmiIsWarning(t string) bool {
	return len(t) >= 7 && strings.EqualFold(t[:7], "WARNING")
}
