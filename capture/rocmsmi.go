package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

// rocm-smi output: `rocm-smi --showall --json` (an object of "cardN"
// objects and a "system" object, every value a string) and the text
// layouts (see rocmsmi_text.go). Both carry the same "Key: value" pairs per
// GPU, which rocmFill turns into GPU fields.
func init() {
	RegisterFile(FileImporter{
		Kind: "rocm-smi",
		Detect: func(_ string, data []byte) bool {
			return rocmIsJSON(data) || rocmIsText(data)
		},
		Parse: func(_ string, data []byte) (*snapshot.Snapshot, error) {
			if rocmIsJSON(data) {
				return parseRocmJSON(data)
			}
			return parseRocmText(data)
		},
	})
}

var rocmCardKey = lazy(`^card(\d+)$`)

// rocmGPUKeys are keys only rocm-smi's per-card objects carry.
var rocmGPUKeys = []string{"PCI Bus", "Unique ID", "VBIOS version", "Device ID", "GPU ID",
	"Card series", "Card Series", "Temperature (Sensor edge) (C)", "(Topology) Numa Node"}

func rocmIsJSON(data []byte) bool {
	t := bytes.TrimSpace(data)
	if len(t) == 0 || t[0] != '{' {
		return false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(t, &top) != nil {
		// Detect sees the first 64 KiB: close what was cut off there.
		fixed, ok := unwrap.CloseJSON(t)
		if !ok || json.Unmarshal(fixed, &top) != nil {
			return false
		}
	}
	for k, v := range top {
		if rocmCardKey().MatchString(k) || k == "system" {
			var obj map[string]json.RawMessage
			if json.Unmarshal(v, &obj) != nil {
				continue
			}
			if _, ok := obj["Driver version"]; ok {
				return true
			}
			for _, key := range rocmGPUKeys {
				if _, ok := obj[key]; ok {
					return true
				}
			}
			for key := range obj {
				if strings.HasPrefix(key, "(Topology) ") {
					return true
				}
			}
		}
	}
	return false
}

// rocmTopo is GPU-pair data: weights, hops and link types by DRM index.
type rocmTopo struct {
	weight  map[[2]int]int
	hops    map[[2]int]int
	kind    map[[2]int]string
	devices map[int]bool
}

func newRocmTopo() *rocmTopo {
	return &rocmTopo{weight: map[[2]int]int{}, hops: map[[2]int]int{}, kind: map[[2]int]string{}, devices: map[int]bool{}}
}

func (t *rocmTopo) empty() bool { return len(t.devices) == 0 }

var rocmPairKey = lazy(`^\(Topology\) (Weight|Hops|Link type) between DRM devices (\d+) and (\d+)$`)

const rocmMaxIndex = 4096

func parseRocmJSON(data []byte) (*snapshot.Snapshot, error) {
	var top map[string]json.RawMessage
	mended := false
	if err := json.Unmarshal(bytes.TrimSpace(data), &top); err != nil {
		fixed, ok := unwrap.CloseJSON(bytes.TrimSpace(data))
		if !ok || json.Unmarshal(fixed, &top) != nil {
			return nil, fmt.Errorf("rocm-smi JSON: %w", err)
		}
		mended = true
	}
	s := snapshot.New()
	if mended {
		s.Notes = append(s.Notes, snapshot.Note{Source: "rocm-smi",
			Message: "the JSON was not whole (cut off, or followed by other output); its complete part was read"})
	}
	cards := map[int]map[string]string{}
	for k, raw := range top {
		m := rocmCardKey().FindStringSubmatch(k)
		if m == nil {
			continue
		}
		idx, err := strconv.Atoi(m[1])
		if err != nil || idx > rocmMaxIndex {
			return nil, fmt.Errorf("rocm-smi JSON: %q is not a card index kiln accepts", k)
		}
		kv, err := rocmStrings(raw)
		if err != nil {
			return nil, fmt.Errorf("rocm-smi JSON: %s: %w", k, err)
		}
		cards[idx] = kv
	}
	topo := newRocmTopo()
	if raw, ok := top["system"]; ok {
		sys, err := rocmStrings(raw)
		if err != nil {
			return nil, fmt.Errorf("rocm-smi JSON: system: %w", err)
		}
		if v := sys["Driver version"]; !amdUnknown(v) {
			s.Drivers.AMDGPU = strings.TrimSpace(v)
		}
		for k, v := range sys {
			m := rocmPairKey().FindStringSubmatch(k)
			if m == nil {
				continue
			}
			a, _ := strconv.Atoi(m[2])
			b, _ := strconv.Atoi(m[3])
			if a > rocmMaxIndex || b > rocmMaxIndex || a == b {
				continue
			}
			topo.set(m[1], a, b, v)
		}
	}
	if len(cards) == 0 && topo.empty() {
		return nil, errors.New("rocm-smi JSON: no cardN objects")
	}
	idx := rocmSortedKeys(cards)
	for _, i := range idx {
		g := snapshot.GPU{Index: i, Vendor: snapshot.VendorAMD, MatrixName: "GPU" + strconv.Itoa(i)}
		rocmFill(&g, cards[i], s)
		s.GPUs = append(s.GPUs, g)
	}
	if !topo.empty() {
		s.Claims = append(s.Claims, snapshot.Claim{
			Source: "rocm-smi", What: "gpus", Count: len(topo.devices),
			Detail: fmt.Sprintf("system block lists %d DRM devices in its topology", len(topo.devices)),
		})
		if len(topo.devices) > len(cards) {
			s.Notes = append(s.Notes, snapshot.Note{Source: "rocm-smi", Message: fmt.Sprintf(
				"the system block lists %d DRM devices but the capture holds %d card objects: the capture is incomplete",
				len(topo.devices), len(cards))})
		}
	}
	rocmApplyTopo(s, topo)
	return s, nil
}

func (t *rocmTopo) set(what string, a, b int, v string) {
	k := [2]int{min(a, b), max(a, b)}
	t.devices[a], t.devices[b] = true, true
	switch strings.ToLower(what) {
	case "weight":
		if n, ok := amdInt(v); ok && n >= 0 {
			t.weight[k] = n
		}
	case "hops":
		if n, ok := amdInt(v); ok && n >= 0 {
			t.hops[k] = n
		}
	default:
		// "XXXX": rocm-smi has no link type for the pair (partitions of
		// one device in TPX); not a link, not a broken one.
		if v = strings.TrimSpace(v); !amdUnknown(v) && !strings.EqualFold(v, "XXXX") {
			t.kind[k] = v
		}
	}
}

// rocmApplyTopo turns pair data into a matrix and links over the GPUs the
// snapshot holds. Pairs naming a GPU the capture does not hold are left
// out (the Claim keeps the count).
func rocmApplyTopo(s *snapshot.Snapshot, t *rocmTopo) {
	if t.empty() || len(s.GPUs) < 2 {
		return
	}
	n := len(s.GPUs)
	m := &snapshot.TopoMatrix{Source: "rocm-smi", Cells: make([][]string, n), NUMA: map[string]int{}}
	hasW, hasH := len(t.weight) > 0, len(t.hops) > 0
	if hasW {
		m.Weights = make([][]int, n)
	}
	if hasH {
		m.Hops = make([][]int, n)
	}
	for i, g := range s.GPUs {
		m.Devices = append(m.Devices, g.MatrixName)
		if g.NUMANode != nil {
			m.NUMA[g.MatrixName] = *g.NUMANode
		}
		m.Cells[i] = make([]string, n)
		if hasW {
			m.Weights[i] = make([]int, n)
		}
		if hasH {
			m.Hops[i] = make([]int, n)
		}
		for j, h := range s.GPUs {
			if i == j {
				m.Cells[i][j] = "X"
				continue
			}
			k := [2]int{min(g.Index, h.Index), max(g.Index, h.Index)}
			m.Cells[i][j] = t.kind[k]
			if hasW {
				m.Weights[i][j] = t.weight[k]
			}
			if hasH {
				m.Hops[i][j] = t.hops[k]
			}
			if j <= i {
				continue
			}
			kind := amdLinkKind(t.kind[k])
			if kind == "" {
				continue
			}
			s.Links = append(s.Links, snapshot.Link{
				A: rocmName(g), B: rocmName(h), Kind: kind, Weight: t.weight[k], Hops: t.hops[k],
			})
		}
	}
	if len(m.NUMA) == 0 {
		m.NUMA = nil
	}
	s.Matrix = m
}

func rocmName(g snapshot.GPU) string {
	if g.PCIAddress != "" {
		return g.PCIAddress
	}
	return g.MatrixName
}

// rocmStrings decodes a JSON object whose values are strings (numbers and
// booleans are printed; nested values are skipped).
func rocmStrings(raw json.RawMessage) (map[string]string, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("not an object of values: %w", err)
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		switch x := v.(type) {
		case string:
			out[k] = x
		case float64:
			out[k] = strconv.FormatFloat(x, 'f', -1, 64)
		case bool:
			out[k] = strconv.FormatBool(x)
		}
	}
	return out, nil
}

func rocmSortedKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

var rocmFWKey = lazy(`(?i)^(.+?) firmware version$`)

// rocmFill sets GPU fields from rocm-smi's "Key: value" pairs (the same keys
// in JSON and text). Keys are matched without regard to case ("Card series"
// and "Card Series" both occur).
func rocmFill(g *snapshot.GPU, kv map[string]string, s *snapshot.Snapshot) {
	low := make(map[string]string, len(kv))
	var keys []string
	for k, v := range kv {
		lk := strings.ToLower(strings.TrimSpace(k))
		low[lk] = strings.TrimSpace(v)
		keys = append(keys, k)
	}
	get := func(names ...string) (string, bool) {
		for _, n := range names {
			if v, ok := low[n]; ok && !amdUnknown(v) {
				return v, true
			}
		}
		return "", false
	}
	num := func(names ...string) (float64, bool) {
		if v, ok := get(names...); ok {
			return amdNum(v)
		}
		return 0, false
	}

	// A name that is a bare id ("Card series: 0x1002" in rocm-smi 4.3) is
	// not a name.
	for _, k := range []string{"card series", "device name", "market name", "marketing name"} {
		if v, ok := get(k); ok && !rocmBareHex(v) {
			g.Model = v
			break
		}
	}
	if v, ok := get("device id", "gpu id"); ok {
		g.DeviceID = amdHexID(v)
	}
	if v, ok := get("unique id"); ok {
		g.UniqueID = amdUniqueID(v)
	}
	if v, ok := get("serial number"); ok {
		g.Serial = v
	}
	if v, ok := get("vbios version"); ok {
		g.VBIOS = v
	}
	if v, ok := get("card sku"); ok {
		g.BoardPart = v
	}
	if v, ok := get("gfx version"); ok && strings.HasPrefix(strings.ToLower(v), "gfx") {
		g.GFXTarget = strings.ToLower(v)
	}
	if v, ok := get("pci bus"); ok {
		if a := amdPCI(v); a != "" {
			g.PCIAddress = a
		} else {
			s.Notes = append(s.Notes, snapshot.Note{Source: "rocm-smi",
				Message: fmt.Sprintf("GPU %d: PCI Bus %q is not a PCI address", g.Index, v)})
		}
	}
	if v, ok := get("node id"); ok {
		if n, ok := amdInt(v); ok && n >= 0 && n <= rocmMaxIndex {
			g.KFDNodes = []int{n}
		}
	}
	if v, ok := get("performance level"); ok {
		g.PerfLevel = strings.ToLower(v)
	}
	// --showhw's RAS state of the memory controller block: HBM/GDDR ECC.
	if v, ok := get("umc ras"); ok {
		switch strings.ToUpper(v) {
		case "ENABLED":
			amdECC(g).Enabled = snapshot.Ptr(true)
		case "DISABLED":
			amdECC(g).Enabled = snapshot.Ptr(false)
		}
	}

	if v, ok := num("temperature (sensor edge) (c)"); ok {
		amdTemp(g).EdgeC = snapshot.Ptr(v)
	}
	if v, ok := num("temperature (sensor junction) (c)"); ok {
		amdTemp(g).JunctionC = snapshot.Ptr(v)
	}
	if v, ok := num("temperature (sensor memory) (c)"); ok {
		amdTemp(g).MemoryC = snapshot.Ptr(v)
	}
	if v, ok := num("current socket graphics package power (w)", "average graphics package power (w)"); ok {
		amdPower(g).DrawW = snapshot.Ptr(v)
	}
	if v, ok := num("max graphics package power (w)"); ok {
		amdPower(g).LimitW = snapshot.Ptr(v)
	}
	pct, hasPct := num("fan speed (%)")
	rpm, hasRPM := num("fan rpm")
	if hasPct || hasRPM {
		f := snapshot.Fan{}
		if hasPct {
			f.Percent = snapshot.Ptr(pct)
		}
		if hasRPM {
			f.RPM = snapshot.Ptr(rpm)
		}
		g.Fans = []snapshot.Fan{f}
	}
	if v, ok := num("sclk clock speed:", "sclk clock speed"); ok {
		amdClocks(g).GraphicsMHz = snapshot.Ptr(v)
	}
	if v, ok := num("mclk clock speed:", "mclk clock speed"); ok {
		amdClocks(g).MemoryMHz = snapshot.Ptr(v)
	}
	if v, ok := num("gpu use (%)"); ok {
		g.UtilizationGPU = snapshot.Ptr(v)
	}
	if v, ok := num("gpu memory allocated (vram%)"); ok {
		g.MemoryUsedPercent = snapshot.Ptr(v)
	}
	if v, ok := get("vram total memory (b)"); ok {
		if n, ok := amdUint(v); ok {
			g.MemoryTotalBytes = n
		}
	}
	if v, ok := get("vram total used memory (b)"); ok {
		if n, ok := amdUint(v); ok {
			g.MemoryUsedBytes = n
		}
	}
	if v, ok := get("vis_vram total memory (b)"); ok {
		if n, ok := amdUint(v); ok {
			g.MemoryVisibleBytes = n
		}
	}

	// PCIe: "pcie clock level" is the current DPM level ("1 (16.0GT/s x16)");
	// the numbered keys are the DPM level list, whose fastest entry is the
	// link's maximum.
	if v, ok := get("pcie clock level"); ok {
		if gen, w := amdSpeedWidth(strings.Trim(rocmAfterSpace(v), "()")); gen > 0 || w > 0 {
			amdPCIe(g).CurrentGen, amdPCIe(g).CurrentWidth = gen, w
		}
	}
	maxGen, maxW := 0, 0
	for k, v := range low {
		if _, err := strconv.Atoi(k); err != nil || !strings.Contains(strings.ToLower(v), "gt/s") {
			continue
		}
		gen, w := amdSpeedWidth(v)
		if gen > maxGen || (gen == maxGen && w > maxW) {
			maxGen, maxW = gen, w
		}
		// The current level is marked "*" where "pcie clock level" is not printed.
		if strings.HasSuffix(v, "*") && (g.PCIe == nil || g.PCIe.CurrentGen == 0) && gen > 0 {
			amdPCIe(g).CurrentGen, amdPCIe(g).CurrentWidth = gen, w
		}
	}
	if maxGen > 0 {
		amdPCIe(g).MaxGen, amdPCIe(g).MaxWidth = maxGen, maxW
	}
	if v, ok := get("pcie replay count"); ok {
		if n, ok := amdUint(v); ok {
			amdPCIe(g).Replays = snapshot.Ptr(n)
		}
	}

	// NUMA: the affinity is the PCI device's own numa_node (-1: none);
	// "Numa Node" is KFD's guess and defaults to 0, so it is used only
	// when no affinity is printed.
	if v, ok := low["(topology) numa affinity"]; ok {
		// -1 is kept: the platform reports no affinity (snapshot.GPU.NUMANode);
		// rocm-smi 4.x prints it as the unsigned 4294967295.
		if n, ok := amdInt(v); ok && n == 1<<32-1 {
			g.NUMANode = snapshot.Ptr(-1)
		} else if ok && n >= -1 && n <= rocmMaxIndex {
			g.NUMANode = snapshot.Ptr(n)
		}
	} else if v, ok := get("(topology) numa node"); ok {
		if n, ok := amdInt(v); ok && n >= 0 && n <= rocmMaxIndex {
			g.NUMANode = snapshot.Ptr(n)
		}
	}

	sort.Strings(keys)
	for _, k := range keys {
		m := rocmFWKey().FindStringSubmatch(strings.TrimSpace(k))
		if m == nil || amdUnknown(kv[k]) {
			continue
		}
		if g.Firmware == nil {
			g.Firmware = map[string]string{}
		}
		g.Firmware[strings.ToUpper(m[1])] = strings.TrimSpace(kv[k])
	}
}

// rocmAfterSpace returns what follows the first space ("1 (16.0GT/s x16)" ->
// "(16.0GT/s x16)"), or s when there is none.
func rocmAfterSpace(s string) string {
	if _, rest, ok := strings.Cut(s, " "); ok {
		return strings.TrimSpace(rest)
	}
	return s
}

// rocmBareHex says whether s is only a hex number ("0x1002").
func rocmBareHex(s string) bool {
	h, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(s)), "0x")
	if !ok || h == "" {
		return false
	}
	_, err := strconv.ParseUint(h, 16, 64)
	return err == nil
}
