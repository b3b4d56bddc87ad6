package capture

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// The lspci importer reads the listing forms of lspci (plain, -nn, -n, -D,
// -k, -v, -vv, -vvv) and the tree form (-t, -tv, -tvnn). From the verbose
// listing it takes each function's PCIe link (LnkCap/LnkSta), ACS control
// bits, AER status bits, NUMA node and driver, and builds the tree from the
// bridges' bus numbers; from the tree form it takes the tree as drawn.

func init() {
	RegisterFile(FileImporter{
		Kind:   "lspci",
		Detect: detectLspci,
		Parse: func(_ string, data []byte) (*snapshot.Snapshot, error) {
			return ParseLspci(data)
		},
	})
}

// lspciFn is one PCI function while it is read.
type lspciFn struct {
	d           snapshot.PCIDevice
	domain, bus int
	// secondary and subordinate are the bus numbers behind a bridge, -1 when
	// the function is not a bridge or they were not printed.
	secondary, subordinate int
	// express is the port kind read from the PCI Express capability
	// (root-port, switch-upstream, switch-downstream), empty otherwise.
	express    string
	vendorName string
	// deviceName is the name after the vendor's ("GA100 [A100 SXM4 80GB]").
	deviceName string
	subsystem  string
	capGen     int
	capWidth   int
	staGen     int
	staWidth   int
	hasLink    bool
	treeBridge bool
}

// lspciVendors maps the vendor names lspci prints (from pci.ids) to their
// ids, for listings printed without -nn. Only exact names are listed.
var lspciVendors = []struct{ name, id string }{
	{"Advanced Micro Devices, Inc. [AMD/ATI]", "1002"},
	{"Advanced Micro Devices, Inc. [AMD]", "1022"},
	{"NVIDIA Corporation", "10de"},
	{"Intel Corporation", "8086"},
	{"Mellanox Technologies", "15b3"},
	{"Broadcom / LSI", "1000"},
	{"Broadcom Inc. and subsidiaries", "14e4"},
	{"Samsung Electronics Co Ltd", "144d"},
	{"Micron Technology Inc", "1344"},
	{"ASPEED Technology, Inc.", "1a03"},
	{"Matrox Electronics Systems Ltd.", "102b"},
	{"PMC-Sierra Inc.", "11f8"},
	{"Pericom Semiconductor", "12d8"},
	{"Renesas Technology Corp.", "1912"},
	{"Microsoft Corporation", "1414"},
	{"Red Hat, Inc.", "1af4"},
	{"Amazon.com, Inc.", "1d0f"},
}

// lspciClasses maps the class names lspci prints to their class codes, for
// listings printed without -nn.
var lspciClasses = map[string]string{
	"Non-VGA unclassified device":     "0000",
	"SCSI storage controller":         "0100",
	"IDE interface":                   "0101",
	"RAID bus controller":             "0104",
	"SATA controller":                 "0106",
	"Serial Attached SCSI controller": "0107",
	"Non-Volatile memory controller":  "0108",
	"Mass storage controller":         "0180",
	"Ethernet controller":             "0200",
	"Infiniband controller":           "0207",
	"Network controller":              "0280",
	"VGA compatible controller":       "0300",
	"3D controller":                   "0302",
	"Display controller":              "0380",
	"Audio device":                    "0403",
	"Multimedia audio controller":     "0401",
	"RAM memory":                      "0500",
	"Memory controller":               "0580",
	"Host bridge":                     "0600",
	"ISA bridge":                      "0601",
	"PCI bridge":                      "0604",
	"Bridge":                          "0680",
	"Communication controller":        "0780",
	"DMA controller":                  "0801",
	"System peripheral":               "0880",
	"USB controller":                  "0c03",
	"SMBus":                           "0c05",
	"Serial bus controller":           "0c80",
	"Signal processing controller":    "1180",
	"Performance counters":            "1101",
	"Processing accelerators":         "1200",
}

// ParseLspci reads lspci output: a listing (plain, -nn, -n, -D, -v up to
// -vvv) or a tree (-t, -tv). It fills Snapshot.PCI with every function and
// Snapshot.GPUs with the GPU functions, their PCIe link and the bridges
// above them.
func ParseLspci(data []byte) (*snapshot.Snapshot, error) {
	s := string(data)
	var (
		fns   []lspciFn
		notes []string
		err   error
	)
	if lspciIsTree(s) {
		fns, notes, err = lspciParseTree(s)
	} else {
		fns, notes, err = lspciParseList(s)
	}
	if err != nil {
		return nil, err
	}
	if len(fns) == 0 {
		return nil, fmt.Errorf("lspci: no PCI function found")
	}
	snap := snapshot.New()
	for _, n := range notes {
		snap.Notes = append(snap.Notes, snapshot.Note{Source: "lspci", Message: n})
	}
	snap.PCI = make([]snapshot.PCIDevice, 0, len(fns))
	byAddr := make(map[string]int, len(fns))
	for i := range fns {
		f := &fns[i]
		if f.hasLink {
			f.d.Link = &snapshot.PCIeLink{CurrentGen: f.staGen, MaxGen: f.capGen, CurrentWidth: f.staWidth, MaxWidth: f.capWidth}
		}
		byAddr[f.d.Address] = i
		snap.PCI = append(snap.PCI, f.d)
	}
	for i := range fns {
		f := &fns[i]
		if f.d.Kind != snapshot.KindGPU {
			continue
		}
		g := snapshot.GPU{
			Index:       len(snap.GPUs),
			Vendor:      lspciGPUVendor(f.d.VendorID),
			Model:       lspciModel(f.deviceName),
			PCIAddress:  f.d.Address,
			DeviceID:    f.d.DeviceID,
			SubsystemID: f.subsystem,
			NUMANode:    f.d.NUMANode,
			Upstream:    lspciUpstream(fns, byAddr, i),
		}
		if f.d.Link != nil {
			l := *f.d.Link
			g.PCIe = &l
		}
		snap.GPUs = append(snap.GPUs, g)
	}
	return snap, nil
}

// lspciUpstream lists the bridges above fns[i], nearest first, up to and
// including the root port.
func lspciUpstream(fns []lspciFn, byAddr map[string]int, i int) []string {
	var up []string
	seen := map[int]bool{i: true}
	for p := fns[i].d.Parent; p != ""; {
		j, ok := byAddr[p]
		if !ok || seen[j] {
			break
		}
		seen[j] = true
		up = append(up, p)
		if fns[j].d.Kind == snapshot.KindRootPort {
			break
		}
		p = fns[j].d.Parent
	}
	return up
}

func lspciGPUVendor(id string) string {
	switch id {
	case "10de":
		return snapshot.VendorNVIDIA
	case "1002":
		return snapshot.VendorAMD
	case "8086":
		return snapshot.VendorIntel
	}
	return ""
}

// lspciModel returns the device name unless it is lspci's placeholder for a
// device missing from its id database ("Device 2330").
func lspciModel(name string) string {
	if name == "" || name == "Device" || (strings.HasPrefix(name, "Device ") && lspciIsHex(name[len("Device "):])) {
		return ""
	}
	return name
}

func lspciIsHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// lspciIDPair reads "10de:2330" (exactly 4:4 hex digits).
func lspciIDPair(s string) (vendor, device string, ok bool) {
	if len(s) != 9 || s[4] != ':' || !lspciIsHex(s[:4]) || !lspciIsHex(s[5:]) {
		return "", "", false
	}
	return strings.ToLower(s[:4]), strings.ToLower(s[5:]), true
}

// lspciLine returns the line without its line ending.
func lspciLine(l string) string {
	l = strings.TrimSuffix(l, "\n")
	return strings.TrimSuffix(l, "\r")
}

func lspciIsWarning(l string) bool {
	return strings.HasPrefix(l, "lspci:") || strings.HasPrefix(l, "pcilib:") || strings.HasPrefix(l, "setpci:")
}

// lspciHeaderAddr checks that a listing line starts with a PCI address in
// lspci's form ([domain:]bus:device.function followed by a space) and
// returns it and the rest of the line.
func lspciHeaderAddr(line string) (addr, rest string, ok bool) {
	sp := strings.IndexByte(line, ' ')
	if sp < 7 {
		return "", "", false
	}
	a := line[:sp]
	if i := strings.LastIndexByte(a, '/'); i >= 0 {
		// lspci -PP prints the path from the root port: "00:01.0/01:00.0"
		// (with -D, "0000:00:01.0/01:00.0"); the function is the last
		// element, in the first one's domain.
		dom := ""
		if first := a[:strings.IndexByte(a, '/')]; strings.Count(first, ":") == 2 {
			dom = first[:strings.IndexByte(first, ':')+1]
		}
		a = dom + a[i+1:]
		if !strings.Contains(a, ":") {
			return "", "", false
		}
	}
	n := len(a)
	if n < 7 { // the last element of a path can be shorter than bus:dev.fn
		return "", "", false
	}
	if a[n-2] != '.' || a[n-1] < '0' || a[n-1] > '7' || a[n-5] != ':' || !lspciIsHex(a[n-7:n-5]) || !lspciIsHex(a[n-4:n-2]) {
		return "", "", false
	}
	if n > 7 {
		dom := a[:n-8]
		if a[n-8] != ':' || len(dom) == 0 || len(dom) > 8 || !lspciIsHex(dom) {
			return "", "", false
		}
	}
	rest = line[sp+1:]
	if !strings.Contains(rest, ": ") && !strings.HasSuffix(rest, ":") {
		return "", "", false
	}
	return a, rest, true
}

// detectLspci recognises lspci listings and trees by their lines: listing
// headers start with a PCI address and a class name; tree output starts
// with "-[dddd:bb]-" or "-+-[dddd:bb]-". Kernel logs that mention PCI
// addresses do not start their lines with them and are not claimed.
func detectLspci(_ string, data []byte) bool {
	if len(data) > 64<<10 {
		data = data[:64<<10]
	}
	headers, others, seen := 0, 0, 0
	for raw := range bytes.Lines(data) {
		line := lspciLine(string(raw))
		if strings.TrimSpace(line) == "" {
			continue
		}
		seen++
		if seen > 400 {
			break
		}
		if headers == 0 && others == 0 && lspciTreeStart(line) {
			return lspciTreeLooksValid(string(data))
		}
		if line[0] == ' ' || line[0] == '\t' {
			if headers == 0 {
				others++
			}
			continue
		}
		if lspciIsWarning(line) {
			continue
		}
		if _, _, ok := lspciHeaderAddr(line); ok {
			headers++
		} else {
			others++
		}
	}
	return headers > 0 && others*8 <= headers
}

// lspciParseList reads the listing forms.
func lspciParseList(s string) ([]lspciFn, []string, error) {
	var (
		fns   []lspciFn
		notes []string
		seen  = map[string]bool{}
	)
	cur := -1
	lineNo := 0
	for raw := range strings.Lines(s) {
		lineNo++
		line := lspciLine(raw)
		if line == "" {
			continue
		}
		if line[0] == '\t' || line[0] == ' ' {
			if cur >= 0 {
				if err := lspciAttr(&fns[cur], strings.TrimLeft(line, " \t"), lineNo); err != nil {
					return nil, nil, err
				}
			}
			continue
		}
		cur = -1
		if lspciIsWarning(line) {
			notes = append(notes, strings.TrimSpace(line))
			continue
		}
		f, ok, err := lspciHeader(line)
		if err != nil {
			notes = append(notes, fmt.Sprintf("line %d: %v", lineNo, err))
			continue
		}
		if !ok {
			if strings.TrimSpace(line) != "" && len(notes) < 20 {
				notes = append(notes, fmt.Sprintf("line %d: skipped %q: not a PCI function", lineNo, lspciClip(line)))
			}
			continue
		}
		if seen[f.d.Address] {
			notes = append(notes, fmt.Sprintf("line %d: %s listed twice; the first listing is kept", lineNo, f.d.Address))
			continue
		}
		seen[f.d.Address] = true
		fns = append(fns, f)
		cur = len(fns) - 1
	}
	for i := range fns {
		fns[i].d.Kind = lspciKind(&fns[i])
	}
	lspciLinkParents(fns)
	return fns, notes, nil
}

func lspciClip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// lspciHeader reads a listing's first line of a function:
// "0001:00:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev a1)".
// ok is false when the line is not a function header at all.
func lspciHeader(line string) (lspciFn, bool, error) {
	a, rest, ok := lspciHeaderAddr(line)
	if !ok {
		return lspciFn{}, false, nil
	}
	addr, err := snapshot.CanonicalPCI(a)
	if err != nil {
		return lspciFn{}, false, fmt.Errorf("cannot read %q as a PCI address: %w", a, err)
	}
	f := lspciFn{secondary: -1, subordinate: -1}
	f.d.Address = addr
	f.domain, f.bus = lspciDomainBus(addr)

	classPart, desc, _ := strings.Cut(rest, ": ")
	if strings.HasSuffix(classPart, ":") && desc == "" {
		classPart = strings.TrimSuffix(classPart, ":")
	}
	switch {
	case len(classPart) == 4 && lspciIsHex(classPart):
		f.d.Class = strings.ToLower(classPart)
	case strings.HasSuffix(classPart, "]") && len(classPart) >= 7 && classPart[len(classPart)-7:len(classPart)-5] == " [" &&
		lspciIsHex(classPart[len(classPart)-5:len(classPart)-1]):
		f.d.Class = strings.ToLower(classPart[len(classPart)-5 : len(classPart)-1])
	case strings.HasPrefix(classPart, "Class ") && lspciIsHex(classPart[len("Class "):]) && len(classPart) == len("Class ")+4:
		f.d.Class = strings.ToLower(classPart[len("Class "):])
	default:
		f.d.Class = lspciClasses[classPart]
	}

	if i := strings.Index(desc, " (prog-if "); i >= 0 {
		desc = desc[:i]
	}
	if i := strings.LastIndex(desc, " (rev "); i >= 0 && strings.HasSuffix(desc, ")") {
		desc = desc[:i]
	}
	desc = strings.TrimSpace(desc)
	lspciNameIDs(&f, desc)
	return f, true, nil
}

// lspciNameIDs fills the vendor and device ids and names from a
// "Vendor Device [vvvv:dddd]" description in any of lspci's forms.
func lspciNameIDs(f *lspciFn, desc string) {
	if v, d, ok := lspciIDPair(desc); ok { // -n: "10de:2330"
		f.d.VendorID, f.d.DeviceID = v, d
		return
	}
	if n := len(desc); n >= 12 && desc[n-1] == ']' && desc[n-12:n-10] == " [" {
		if v, d, ok := lspciIDPair(desc[n-10 : n-1]); ok { // -nn
			f.d.VendorID, f.d.DeviceID = v, d
			desc = desc[:n-12]
		}
	} else if n >= 10 && desc[0] == '[' && desc[n-1] == ']' {
		if v, d, ok := lspciIDPair(desc[1 : n-1]); ok {
			f.d.VendorID, f.d.DeviceID = v, d
			desc = ""
		}
	}
	f.d.Name = desc
	if strings.HasPrefix(desc, "Device ") { // unknown vendor: "Device 1e0f:0007"
		if v, d, ok := lspciIDPair(desc[len("Device "):]); ok && f.d.VendorID == "" {
			f.d.VendorID, f.d.DeviceID = v, d
		}
	}
	for _, v := range lspciVendors {
		if desc == v.name || strings.HasPrefix(desc, v.name+" ") {
			f.vendorName = v.name
			f.deviceName = strings.TrimSpace(desc[len(v.name):])
			if f.d.VendorID == "" {
				f.d.VendorID = v.id
			}
			break
		}
	}
	if f.d.DeviceID == "" && f.vendorName != "" {
		if dn := f.deviceName; strings.HasPrefix(dn, "Device ") && len(dn) == len("Device ")+4 && lspciIsHex(dn[len("Device "):]) {
			f.d.DeviceID = strings.ToLower(dn[len("Device "):])
		}
	}
}

// lspciSubsystem reads "NVIDIA Corporation Device 16c1" or
// "NVIDIA Corporation Device [10de:16c1]" as "10de:16c1"; empty when the
// ids cannot be read.
func lspciSubsystem(v string) string {
	var f lspciFn
	lspciNameIDs(&f, strings.TrimSpace(v))
	if f.d.VendorID == "" || f.d.DeviceID == "" {
		return ""
	}
	return f.d.VendorID + ":" + f.d.DeviceID
}

func lspciDomainBus(addr string) (domain, bus int) {
	d, _ := strconv.ParseUint(addr[0:4], 16, 32)
	b, _ := strconv.ParseUint(addr[5:7], 16, 32)
	return int(d), int(b)
}

// lspciAttr reads one indented line of a verbose listing into f.
func lspciAttr(f *lspciFn, t string, lineNo int) error {
	switch {
	case strings.HasPrefix(t, "Subsystem:"):
		f.subsystem = lspciSubsystem(t[len("Subsystem:"):])
	case strings.HasPrefix(t, "NUMA node:"):
		v := strings.TrimSpace(t[len("NUMA node:"):])
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("lspci: line %d: cannot read %q as a NUMA node", lineNo, v)
		}
		if n >= -1 { // -1: the platform reports no affinity
			f.d.NUMANode = snapshot.Ptr(n)
		}
	case strings.HasPrefix(t, "Bus: "):
		for _, kv := range strings.Split(t[len("Bus: "):], ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
			n, err := strconv.ParseUint(v, 16, 8)
			if err != nil {
				continue
			}
			switch k {
			case "secondary", "cardbus":
				f.secondary = int(n)
			case "subordinate":
				f.subordinate = int(n)
			}
		}
	case strings.HasPrefix(t, "Kernel driver in use:"):
		f.d.Driver = strings.TrimSpace(t[len("Kernel driver in use:"):])
	case strings.HasPrefix(t, "Capabilities: ["):
		_, c, ok := strings.Cut(t, "] Express ")
		if !ok {
			return nil
		}
		switch {
		case strings.Contains(c, "Root Port"):
			f.express = snapshot.KindRootPort
		case strings.Contains(c, "Upstream Port"):
			f.express = snapshot.KindSwitchUp
		case strings.Contains(c, "Downstream Port"):
			f.express = snapshot.KindSwitchDown
		}
	case strings.HasPrefix(t, "LnkCap:"):
		f.capGen, f.capWidth = lnkSpeedWidth(t[len("LnkCap:"):])
		f.hasLink = true
	case strings.HasPrefix(t, "LnkSta:"):
		f.staGen, f.staWidth = lnkSpeedWidth(t[len("LnkSta:"):])
		f.hasLink = true
	case strings.HasPrefix(t, "ACSCtl:"):
		acs := &snapshot.ACS{}
		for _, fl := range strings.Fields(t[len("ACSCtl:"):]) {
			on := strings.HasSuffix(fl, "+")
			switch strings.TrimRight(fl, "+-") {
			case "SrcValid":
				acs.SrcValid = on
			case "TransBlk":
				acs.TransBlk = on
			case "ReqRedir":
				acs.ReqRedir = on
			case "CmpltRedir":
				acs.CmpltRedir = on
			case "UpstreamFwd":
				acs.UpstreamFwd = on
			case "EgressCtrl":
				acs.EgressCtrl = on
			case "DirectTrans":
				acs.DirectTrans = on
			}
		}
		f.d.ACS = acs
	case strings.HasPrefix(t, "UESta:"):
		if f.d.AER == nil {
			f.d.AER = &snapshot.AER{}
		}
		f.d.AER.Uncorrectable = lspciSetBits(t[len("UESta:"):])
	case strings.HasPrefix(t, "CESta:"):
		if f.d.AER == nil {
			f.d.AER = &snapshot.AER{}
		}
		f.d.AER.Correctable = lspciSetBits(t[len("CESta:"):])
	}
	return nil
}

// lspciSetBits returns the names of the flags printed with a trailing '+'.
func lspciSetBits(v string) []string {
	var on []string
	for _, fl := range strings.Fields(v) {
		if len(fl) > 1 && strings.HasSuffix(fl, "+") {
			on = append(on, fl[:len(fl)-1])
		}
	}
	return on
}

// lspciKind classifies a function of a listing by its class code, vendor
// and PCI Express port type.
func lspciKind(f *lspciFn) string {
	c := f.d.Class
	switch {
	case f.express != "":
		return f.express
	case c == "0604" || c == "0609":
		return snapshot.KindBridge
	case c == "0600":
		return snapshot.KindHostBridge
	case c == "0680" && f.d.VendorID == "10de":
		return snapshot.KindNVSwitch
	case lspciIsGPUClass(c, f.d.VendorID):
		return snapshot.KindGPU
	case strings.HasPrefix(c, "02"):
		return snapshot.KindNIC
	case c == "0108":
		return snapshot.KindNVMe
	}
	return snapshot.KindOther
}

// lspciIsGPUClass: display controllers (VGA, 3D, other display) of the GPU
// vendors, and AMD's processing accelerators (Instinct MI300 reports class
// 1200).
func lspciIsGPUClass(class, vendor string) bool {
	switch vendor {
	case "10de", "1002", "8086":
	default:
		return false
	}
	switch class {
	case "0300", "0302", "0380":
		return true
	case "1200":
		return vendor == "1002"
	}
	return false
}

// lspciLinkParents sets each function's parent: the bridge in the same
// domain whose secondary bus is the function's bus, else the bridge with
// the narrowest bus range holding it.
func lspciLinkParents(fns []lspciFn) {
	type key struct{ dom, bus int }
	bySec := map[key]int{}
	var bridges []int
	for i := range fns {
		f := &fns[i]
		if f.secondary < 0 {
			continue
		}
		k := key{f.domain, f.secondary}
		if _, dup := bySec[k]; !dup {
			bySec[k] = i
		}
		bridges = append(bridges, i)
	}
	for i := range fns {
		f := &fns[i]
		if j, ok := bySec[key{f.domain, f.bus}]; ok && j != i {
			f.d.Parent = fns[j].d.Address
			continue
		}
		best := -1
		for _, j := range bridges {
			b := &fns[j]
			if j == i || b.domain != f.domain || b.subordinate < b.secondary || f.bus < b.secondary || f.bus > b.subordinate {
				continue
			}
			if best < 0 || b.subordinate-b.secondary < fns[best].subordinate-fns[best].secondary {
				best = j
			}
		}
		if best >= 0 {
			f.d.Parent = fns[best].d.Address
		}
	}
	// A function cannot sit below itself: break any cycle that bad bus
	// numbers would make.
	byAddr := make(map[string]int, len(fns))
	for i := range fns {
		byAddr[fns[i].d.Address] = i
	}
	for i := range fns {
		seen := map[int]bool{i: true}
		for p := fns[i].d.Parent; p != ""; {
			j, ok := byAddr[p]
			if !ok {
				break
			}
			if j == i {
				fns[i].d.Parent = ""
				break
			}
			if seen[j] {
				break // a cycle above i: broken when one of its members is visited
			}
			seen[j] = true
			p = fns[j].d.Parent
		}
	}
}

// lspciTreeStart says whether a line opens lspci's tree: "-[0000:00]-+-00.0"
// for one root bus, "-+-[0000:ff]-+-08.0" for several.
func lspciTreeStart(line string) bool {
	return strings.HasPrefix(line, "-[") || strings.HasPrefix(line, "-+-[")
}

func lspciIsTree(s string) bool {
	for raw := range strings.Lines(s) {
		line := lspciLine(raw)
		if strings.TrimSpace(line) == "" || lspciIsWarning(line) {
			continue
		}
		return lspciTreeStart(line)
	}
	return false
}

// lspciTreeLooksValid checks the first line of a tree: a root bus
// "[dddd:bb]" followed by a device "dd.f".
func lspciTreeLooksValid(s string) bool {
	for raw := range strings.Lines(s) {
		line := lspciLine(raw)
		if strings.TrimSpace(line) == "" || lspciIsWarning(line) {
			continue
		}
		i := strings.IndexByte(line, '[')
		j := strings.IndexByte(line, ']')
		if i < 0 || j < i {
			return false
		}
		if _, _, ok := lspciTreeBus(line[i+1 : j]); !ok {
			return false
		}
		rest := strings.TrimLeft(line[j+1:], "-+\\")
		return len(rest) >= 4 && lspciTreeDev(rest[:4])
	}
	return false
}

// lspciTreeBus reads a tree's "dddd:bb" root bus label.
func lspciTreeBus(s string) (domain, bus int, ok bool) {
	d, b, found := strings.Cut(s, ":")
	if !found || len(d) < 1 || len(d) > 4 || len(b) != 2 || !lspciIsHex(d) || !lspciIsHex(b) {
		return 0, 0, false
	}
	dv, _ := strconv.ParseUint(d, 16, 32)
	bv, _ := strconv.ParseUint(b, 16, 32)
	return int(dv), int(bv), true
}

// lspciTreeDev checks a tree's "dd.f" device label.
func lspciTreeDev(s string) bool {
	return len(s) == 4 && lspciIsHex(s[:2]) && s[2] == '.' && s[3] >= '0' && s[3] <= '7'
}

// lspciTreeRange reads a bridge's "ss" or "ss-uu" bus range.
func lspciTreeRange(s string) (sec, sub int, ok bool) {
	a, b, two := strings.Cut(s, "-")
	if !two {
		b = a
	}
	if len(a) != 2 || len(b) != 2 || !lspciIsHex(a) || !lspciIsHex(b) {
		return 0, 0, false
	}
	av, _ := strconv.ParseUint(a, 16, 32)
	bv, _ := strconv.ParseUint(b, 16, 32)
	return int(av), int(bv), true
}

// lspciParseTree reads lspci -t output. lspci draws every device of a bus
// at one column: the devices of a root bus "[dddd:bb]" start 12 columns
// after its '[', the devices behind a bridge "dd.f-[ss-uu]-" start 3
// columns after the bridge's range. Each such column remembers its bus and
// the bridge above it; a later registration of the same column replaces the
// earlier one, as lspci draws depth first.
func lspciParseTree(s string) ([]lspciFn, []string, error) {
	type busCtx struct {
		domain, bus int
		parent      string
	}
	var (
		fns   []lspciFn
		notes []string
	)
	ctx := map[int]busCtx{}
	rootParent := map[int]string{}
	seen := map[string]bool{}
	lineNo := 0
	for raw := range strings.Lines(s) {
		lineNo++
		line := lspciLine(raw)
		if strings.TrimSpace(line) == "" || lspciIsWarning(line) {
			continue
		}
		lastBridge, afterBridge := "", -1
		i := 0
	scan:
		for i < len(line) {
			switch c := line[i]; {
			case c == ' ' || c == '|' || c == '+' || c == '\\' || c == '-':
				i++
			case c == '[':
				j := strings.IndexByte(line[i:], ']')
				if j < 0 {
					break scan
				}
				dom, bus, ok := lspciTreeBus(line[i+1 : i+j])
				if !ok {
					break scan // "[virtual] Memory at ..." of -tvv
				}
				parent := rootParent[i]
				if afterBridge >= 0 && i == afterBridge {
					parent = lastBridge
				}
				rootParent[i] = parent
				ctx[i+12] = busCtx{dom, bus, parent}
				i += j + 1
			case i+4 <= len(line) && lspciTreeDev(line[i:i+4]):
				bc, ok := ctx[i]
				if !ok {
					notes = append(notes, fmt.Sprintf("line %d: device %s at column %d belongs to no bus drawn above; skipped", lineNo, line[i:i+4], i+1))
					break scan
				}
				dv, _ := strconv.ParseUint(line[i:i+2], 16, 32)
				fv := line[i+3] - '0'
				addr := fmt.Sprintf("%04x:%02x:%02x.%d", bc.domain, bc.bus, dv, fv)
				if _, err := snapshot.CanonicalPCI(addr); err != nil {
					notes = append(notes, fmt.Sprintf("line %d: %v; skipped", lineNo, err))
					break scan
				}
				f := lspciFn{secondary: -1, subordinate: -1}
				f.d.Address = addr
				f.d.Parent = bc.parent
				f.domain, f.bus = bc.domain, bc.bus
				i += 4
				if strings.HasPrefix(line[i:], "-[") {
					j := strings.IndexByte(line[i:], ']')
					if j < 0 {
						break scan
					}
					sec, sub, ok := lspciTreeRange(line[i+2 : i+j])
					if !ok {
						break scan
					}
					f.secondary, f.subordinate, f.treeBridge = sec, sub, true
					e := i + j + 2 // past "]-"
					ctx[e+3] = busCtx{bc.domain, sec, addr}
					lastBridge, afterBridge = addr, e+3
					i = e
				} else {
					lspciNameIDs(&f, strings.TrimSpace(line[i:]))
					i = len(line)
				}
				if seen[addr] {
					notes = append(notes, fmt.Sprintf("line %d: %s drawn twice; the first is kept", lineNo, addr))
					continue
				}
				seen[addr] = true
				fns = append(fns, f)
			default:
				break scan // -tvv region lines, or text kiln does not read
			}
		}
	}
	lspciTreeKinds(fns)
	return fns, notes, nil
}

// lspciTreeKinds classifies the functions of a tree, which carries no class
// codes: bridges by their place (a bridge on a root bus is a root port, a
// bridge below a root port or downstream port with bridges below it is a
// switch's upstream port, a bridge below an upstream port is a downstream
// port), other functions by their ids and names.
func lspciTreeKinds(fns []lspciFn) {
	idx := make(map[string]int, len(fns))
	hasBridgeChild := map[string]bool{}
	for i := range fns {
		idx[fns[i].d.Address] = i
		if fns[i].treeBridge && fns[i].d.Parent != "" {
			hasBridgeChild[fns[i].d.Parent] = true
		}
	}
	for i := range fns {
		f := &fns[i]
		if !f.treeBridge {
			f.d.Kind = lspciTreeLeafKind(f)
			continue
		}
		parentKind := ""
		if j, ok := idx[f.d.Parent]; ok && j < i {
			parentKind = fns[j].d.Kind
		}
		switch {
		case f.d.Parent == "":
			f.d.Kind = snapshot.KindRootPort
		case parentKind == snapshot.KindSwitchUp:
			f.d.Kind = snapshot.KindSwitchDown
		case (parentKind == snapshot.KindRootPort || parentKind == snapshot.KindSwitchDown) && hasBridgeChild[f.d.Address]:
			f.d.Kind = snapshot.KindSwitchUp
		default:
			f.d.Kind = snapshot.KindBridge
		}
	}
}

// lspciTreeLeafKind guesses the kind of a tree leaf from its ids and name.
func lspciTreeLeafKind(f *lspciFn) string {
	name := f.d.Name
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(name, w) {
				return true
			}
		}
		return false
	}
	switch {
	case f.d.VendorID == "10de" && (f.d.DeviceID == "22a3" || f.d.DeviceID == "1af1" || has("NVSwitch")):
		return snapshot.KindNVSwitch
	case has("Ethernet", "Network", "Infiniband", "InfiniBand", "ConnectX"):
		return snapshot.KindNIC
	case has("NVMe", "Non-Volatile"):
		return snapshot.KindNVMe
	case has("Audio", "HDMI", "USB", "UCSI", "Serial", "SMBus", "LPC", "ISA", "SATA", "Memory", "Host Bridge", "Host bridge", "Bridge"):
		return snapshot.KindOther
	}
	switch f.d.VendorID {
	case "10de":
		return snapshot.KindGPU
	case "1002":
		if f.vendorName != "Advanced Micro Devices, Inc. [AMD]" {
			return snapshot.KindGPU
		}
	case "8086":
		if has("Graphics", "GPU") {
			return snapshot.KindGPU
		}
	}
	return snapshot.KindOther
}
