package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/kfd"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

// amd-smi output: `amd-smi static`, `amd-smi list` and `amd-smi metric`,
// as JSON (--json) or as the default text. Several outputs may be
// concatenated in one file; entries of one GPU are joined.
//
// JSON: older releases print a list of per-GPU objects ([{"gpu": 0, "asic":
// {...}, "bus": {...}}]); newer ones wrap it ({"gpu_data": [...]}). Values
// with units are {"value": 32, "unit": "GT/s"}; unknown values are "N/A".
// Text: "GPU: 0" opens a block; nested "KEY: value" lines are indented by
// four spaces per level, keys are the JSON keys in upper case and values
// carry their unit ("32 GT/s", "196592 MB"). `amd-smi monitor` and `amd-smi
// topology` print tables instead (amdsmi_tables.go). A notice that amd-smi
// could not open the GPU device nodes may come first, in both forms.
func init() {
	RegisterFile(FileImporter{
		Kind: "amd-smi",
		Detect: func(_ string, data []byte) bool {
			return amdIsJSON(data) || amdIsText(data)
		},
		Parse: func(_ string, data []byte) (*snapshot.Snapshot, error) {
			if amdIsJSON(data) {
				return parseAMDSMIJSON(data)
			}
			return parseAMDSMIText(data)
		},
	})
}

// amdGPUKeys are the per-GPU sections amd-smi prints.
var amdGPUKeys = []string{"asic", "bus", "bdf", "uuid", "kfd_id", "usage", "power", "pcie", "vram",
	"mem_usage", "temperature", "board", "partition", "numa", "ifwi", "vbios", "driver", "limit"}

func amdIsJSON(data []byte) bool {
	_, entries, _, _, ok := amdLocateJSON(data)
	return ok && len(entries) > 0
}

// amdMaxBanner is how many lines of text amd-smi may print before its JSON
// (the permission notice of a run without access to the GPU device nodes
// is 14).
const amdMaxBanner = 64

// amdLocateJSON finds amd-smi's JSON in data: at its start, or after a short
// text banner. It returns where the JSON starts, the per-GPU entries, the
// ROCm version, and whether the document had to be mended because its end
// was cut off (as in the first 64 KiB that Detect sees).
func amdLocateJSON(data []byte) (start int, entries []map[string]any, rocm string, mended, ok bool) {
	off := 0
	for n := 0; n <= amdMaxBanner && off < len(data); n++ {
		end := bytes.IndexByte(data[off:], '\n')
		line := data[off:]
		if end >= 0 {
			line = data[off : off+end]
		}
		t := bytes.TrimLeft(line, " \t")
		if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
			at := off + len(line) - len(t)
			if e, r, m, err := amdDecodeMended(data[at:]); err == nil && len(e) > 0 {
				return at, e, r, m, true
			}
		}
		if end < 0 {
			break
		}
		off += end + 1
	}
	return 0, nil, "", false, false
}

// amdDecodeMended decodes data, closing a document whose tail was cut off.
func amdDecodeMended(data []byte) ([]map[string]any, string, bool, error) {
	entries, rocm, err := amdDecodeJSON(data)
	if err == nil {
		return entries, rocm, false, nil
	}
	// Mend only a document that was cut (or GPU entries that other output
	// follows), not any text that happens to start with a bracket.
	if len(entries) == 0 && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, "", false, err
	}
	fixed, ok := unwrap.CloseJSON(data)
	if !ok {
		return nil, "", false, err
	}
	entries, rocm, err2 := amdDecodeJSON(fixed)
	if err2 != nil {
		return nil, "", false, err
	}
	return entries, rocm, true, nil
}

// amdDecodeJSON reads every JSON value in data and returns the per-GPU
// objects, and the ROCm version when an `amd-smi version` output is among
// them.
func amdDecodeJSON(data []byte) (entries []map[string]any, rocm string, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		var v any
		if err := dec.Decode(&v); err == io.EOF {
			break
		} else if err != nil {
			// The entries before the error are returned too: they say
			// whether mending the document is worth it.
			return entries, rocm, fmt.Errorf("amd-smi JSON: %w", err)
		}
		var list []any
		switch x := v.(type) {
		case []any:
			list = x
		case map[string]any:
			if g, ok := x["gpu_data"].([]any); ok {
				list = g
			} else {
				list = []any{x}
			}
		}
		for _, item := range list {
			obj, ok := item.(map[string]any)
			if !ok {
				continue
			}
			if r, ok := amdStr(obj["rocm_version"]); ok {
				rocm = r
			}
			if _, ok := obj["gpu"]; !ok {
				continue
			}
			for _, k := range amdGPUKeys {
				if _, ok := obj[k]; ok {
					entries = append(entries, obj)
					break
				}
			}
		}
	}
	return entries, rocm, nil
}

var (
	amdTextGPU = lazy(`(?m)^GPU: \d+\s*$`)
	amdTextKey = lazy(`(?m)^ {4}(BDF|UUID|ASIC|BUS|USAGE|POWER|PCIE|VRAM|MEM_USAGE|BOARD|PARTITION|NUMA|TEMPERATURE|IFWI|VBIOS|DRIVER|KFD_ID|NODE_ID):`)
)

func amdIsText(data []byte) bool {
	if rocmIsText(data) {
		return false
	}
	return amdTextGPU().Match(data) && amdTextKey().Match(data) || amdHasTable(data)
}

func parseAMDSMIJSON(data []byte) (*snapshot.Snapshot, error) {
	start, entries, rocm, mended, ok := amdLocateJSON(data)
	if !ok {
		return nil, errors.New("amd-smi JSON: no GPU entry")
	}
	s := amdBuild(entries)
	if rocm != "" {
		s.Drivers.ROCm = rocm
	}
	if len(s.GPUs) == 0 {
		return nil, errors.New("amd-smi JSON: no GPU entry")
	}
	amdBanner(s, data[:start])
	if mended {
		s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi",
			Message: "the JSON was not whole (cut off, or followed by other output); its complete part was read"})
	}
	return s, nil
}

var amdROCmVersion = lazy(`ROCm version: ([0-9][0-9A-Za-z.\-]*)`)

// parseAMDSMIText turns the indented text into the same trees as JSON.
func parseAMDSMIText(data []byte) (*snapshot.Snapshot, error) {
	type frame struct {
		indent int
		m      map[string]any
	}
	var entries []map[string]any
	var stack []frame
	rocm := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), " \t\r")
		if m := amdROCmVersion().FindStringSubmatch(line); m != nil {
			rocm = m[1]
		}
		trim := strings.TrimSpace(line)
		if trim == "" {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		key, val, ok := strings.Cut(trim, ":")
		if !ok {
			continue
		}
		// "CURRENT LEVEL" is the JSON's "current_level".
		key = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(key)), " ", "_")
		val = strings.TrimSpace(val)
		if indent == 0 {
			stack = nil
			if key == "gpu" {
				id, err := strconv.Atoi(val)
				if err != nil || id < 0 || id > rocmMaxIndex {
					return nil, fmt.Errorf("amd-smi text: line %d: %q is not a GPU number", n, val)
				}
				m := map[string]any{"gpu": json.Number(strconv.Itoa(id))}
				entries = append(entries, m)
				stack = []frame{{0, m}}
			}
			continue
		}
		if len(stack) == 0 {
			continue // inside a CPU block or a header
		}
		for len(stack) > 1 && indent <= stack[len(stack)-1].indent {
			stack = stack[:len(stack)-1]
		}
		parent := stack[len(stack)-1].m
		if val == "" {
			child := map[string]any{}
			parent[key] = child
			stack = append(stack, frame{indent, child})
			continue
		}
		parent[key] = val
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("amd-smi text: line %d: %w", n+1, err)
	}
	t := amdScanTables(data)
	entries = t.mergeInto(entries)
	s := amdBuild(entries)
	if rocm != "" {
		s.Drivers.ROCm = rocm
	}
	if len(s.GPUs) == 0 {
		return nil, errors.New("amd-smi text: no \"GPU: n\" block, monitor table or topology table")
	}
	t.apply(s)
	amdBanner(s, data)
	return s, nil
}

// amdBuild joins the entries of each GPU (by its number) and fills GPUs.
func amdBuild(entries []map[string]any) *snapshot.Snapshot {
	s := snapshot.New()
	byID := map[int]map[string]any{}
	for _, e := range entries {
		id, ok := amdInt64(e["gpu"])
		if !ok || id < 0 || id > rocmMaxIndex {
			continue
		}
		m := byID[int(id)]
		if m == nil {
			m = map[string]any{}
			byID[int(id)] = m
		}
		for k, v := range e {
			if old, ok := m[k].(map[string]any); ok {
				if nv, ok := v.(map[string]any); ok {
					for kk, vv := range nv {
						old[kk] = vv
					}
					continue
				}
			}
			m[k] = v
		}
	}
	var gpus []snapshot.GPU
	var parted []bool
	for _, id := range rocmSortedKeys(byID) {
		// MatrixName lets a metric capture without BDFs join a static one.
		g := snapshot.GPU{Index: id, Vendor: snapshot.VendorAMD, MatrixName: "GPU" + strconv.Itoa(id)}
		parted = append(parted, amdFill(&g, byID[id], s))
		gpus = append(gpus, g)
	}
	s.GPUs = amdGroupPartitions(gpus, parted)
	return s
}

// amdGroupPartitions folds partitions listed as separate GPUs (entries
// with a partition id on one PCI device) into one GPU per device, and
// counts them.
func amdGroupPartitions(gpus []snapshot.GPU, parted []bool) []snapshot.GPU {
	var out []snapshot.GPU
	var size []int
	at := map[string]int{}
	for i, g := range gpus {
		key := ""
		if parted[i] && g.PCIAddress != "" {
			key = g.PCIAddress[:len(g.PCIAddress)-2] // dddd:bb:dd
		}
		j, ok := at[key]
		if key == "" || !ok {
			if key != "" {
				at[key] = len(out)
			}
			out = append(out, g)
			size = append(size, 1)
			continue
		}
		o := &out[j]
		size[j]++
		o.KFDNodes = append(o.KFDNodes, g.KFDNodes...)
		if g.PCIAddress < o.PCIAddress {
			o.PCIAddress = g.PCIAddress
		}
		if o.Partition == nil {
			o.Partition = g.Partition
		}
	}
	for i := range out {
		out[i].Index = i
		sort.Ints(out[i].KFDNodes)
		switch p := out[i].Partition; {
		case size[i] > 1:
			if p == nil {
				p = &snapshot.Partition{}
				out[i].Partition = p
			}
			p.Count = size[i]
		case p != nil && p.Compute == "SPX":
			p.Count = 1
		}
	}
	return out
}

// amdPath walks nested objects.
func amdPath(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = obj[k]
	}
	return cur
}

// amdStr prints a leaf value; ok is false when it is absent or unknown.
func amdStr(v any) (string, bool) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		s = strconv.FormatBool(x)
	case map[string]any:
		return amdStr(x["value"])
	default:
		return "", false
	}
	s = strings.TrimSpace(s)
	if amdUnknown(s) {
		return "", false
	}
	return s, true
}

// amdQty reads a quantity: a number, "32 GT/s", or {"value": 32, "unit":
// "GT/s"}. unit is "" when none is printed.
func amdQty(v any) (val float64, unit string, ok bool) {
	if obj, isObj := v.(map[string]any); isObj {
		u, _ := amdStr(obj["unit"])
		val, _, ok = amdQty(obj["value"])
		return val, u, ok
	}
	s, ok := amdStr(v)
	if !ok {
		return 0, "", false
	}
	val, ok = amdNum(s)
	if !ok {
		return 0, "", false
	}
	f := strings.Fields(s)
	if len(f) > 1 {
		unit = f[1]
	}
	return val, unit, true
}

func amdInt64(v any) (int64, bool) {
	s, ok := amdStr(v)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// amdBytes converts a memory size with its unit to bytes. amd-smi's "MB"
// is MiB (the CLI divides bytes by 1024*1024).
func amdBytes(v float64, unit string) (uint64, bool) {
	if v < 0 || v > 1<<50 {
		return 0, false
	}
	mult := float64(1 << 20)
	switch strings.ToUpper(unit) {
	case "B":
		mult = 1
	case "KB", "KIB":
		mult = 1 << 10
	case "GB", "GIB":
		mult = 1 << 30
	}
	return uint64(v * mult), true
}

// amdFill sets GPU fields from one GPU's joined entries. It reports whether
// the entries carry a partition id.
func amdFill(g *snapshot.GPU, m map[string]any, s *snapshot.Snapshot) (partitioned bool) {
	str := func(keys ...string) (string, bool) { return amdStr(amdPath(m, keys...)) }
	qty := func(keys ...string) (float64, string, bool) { return amdQty(amdPath(m, keys...)) }

	for _, p := range [][]string{{"bdf"}, {"bus", "bdf"}} {
		if v, ok := str(p...); ok {
			if a := amdPCI(v); a != "" {
				g.PCIAddress = a
			} else {
				s.Notes = append(s.Notes, snapshot.Note{Source: "amd-smi",
					Message: fmt.Sprintf("GPU %d: BDF %q is not a PCI address", g.Index, v)})
			}
		}
	}
	if v, ok := str("uuid"); ok {
		g.UUID = v
	}
	if n, ok := amdInt64(amdPath(m, "node_id")); ok && n >= 0 && n <= rocmMaxIndex {
		g.KFDNodes = []int{int(n)}
	}
	if v, ok := str("asic", "market_name"); ok {
		g.Model = v
	} else if v, ok := str("board", "product_name"); ok {
		g.Model = v
	}
	if v, ok := str("asic", "device_id"); ok {
		if strings.HasPrefix(strings.ToLower(v), "0x") {
			g.DeviceID = amdHexID(v)
		} else if n, err := strconv.ParseUint(v, 10, 16); err == nil {
			g.DeviceID = fmt.Sprintf("%04x", n)
		}
	}
	if v, ok := str("asic", "target_graphics_version"); ok {
		if strings.HasPrefix(strings.ToLower(v), "gfx") {
			g.GFXTarget = strings.ToLower(v)
		} else if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			g.GFXTarget = kfd.GFXTarget(n)
		}
	}
	if v, ok := str("asic", "asic_serial"); ok {
		g.UniqueID = amdUniqueID(v)
	}
	if v, ok := str("board", "product_serial"); ok {
		g.Serial = v
	}
	if v, ok := str("board", "model_number"); ok {
		g.BoardPart = v
	}
	for _, sec := range []string{"ifwi", "vbios"} {
		if v, ok := str(sec, "version"); ok {
			g.VBIOS = v
		}
	}
	if v, ok := str("driver", "version"); ok {
		if name, _ := str("driver", "name"); name == "" || strings.EqualFold(name, "amdgpu") {
			s.Drivers.AMDGPU = v
		}
	}
	if v, u, ok := qty("vram", "size"); ok {
		if b, ok := amdBytes(v, u); ok && b > 0 {
			g.MemoryTotalBytes = b
		}
	}
	if v, u, ok := qty("mem_usage", "total_vram"); ok && g.MemoryTotalBytes == 0 {
		if b, ok := amdBytes(v, u); ok {
			g.MemoryTotalBytes = b
		}
	}
	if v, u, ok := qty("mem_usage", "used_vram"); ok {
		if b, ok := amdBytes(v, u); ok {
			g.MemoryUsedBytes = b
		}
	}
	if v, u, ok := qty("mem_usage", "total_visible_vram"); ok {
		if b, ok := amdBytes(v, u); ok {
			g.MemoryVisibleBytes = b
		}
	}

	// NUMA: affinity (the device's numa_node, -1 or NONE for none) first.
	if aff := amdPath(m, "numa", "affinity"); aff != nil {
		if n, ok := amdInt64(aff); ok && n >= 0 && n <= rocmMaxIndex {
			g.NUMANode = snapshot.Ptr(int(n))
		}
	} else if n, ok := amdInt64(amdPath(m, "numa", "node")); ok && n >= 0 && n <= rocmMaxIndex {
		g.NUMANode = snapshot.Ptr(int(n))
	}

	// PCIe: static bus section gives the maximum, metric pcie the current link.
	if v, _, ok := qty("bus", "max_pcie_speed"); ok && amdGen(v) > 0 {
		amdPCIe(g).MaxGen = amdGen(v)
	} else if v, ok := str("bus", "pcie_interface_version"); ok {
		if n, ok := amdNum(strings.TrimPrefix(strings.TrimSpace(v), "Gen")); ok && n >= 1 && n <= 6 {
			amdPCIe(g).MaxGen = int(n)
		}
	}
	if v, _, ok := qty("bus", "max_pcie_width"); ok && v > 0 && v <= 32 {
		amdPCIe(g).MaxWidth = int(v)
	}
	if v, _, ok := qty("pcie", "speed"); ok && amdGen(v) > 0 {
		amdPCIe(g).CurrentGen = amdGen(v)
	}
	if v, _, ok := qty("pcie", "width"); ok && v > 0 && v <= 32 {
		amdPCIe(g).CurrentWidth = int(v)
	}
	if n, ok := amdInt64(amdPath(m, "pcie", "replay_count")); ok && n >= 0 {
		amdPCIe(g).Replays = snapshot.Ptr(uint64(n))
	}
	if n, ok := amdInt64(amdPath(m, "pcie", "replay_roll_over_count")); ok && n >= 0 {
		amdPCIe(g).ReplayRollovers = snapshot.Ptr(uint64(n))
	}

	// Partition: "compute_partition" in older releases, "accelerator_partition" in newer.
	part := &snapshot.Partition{}
	for _, k := range []string{"compute_partition", "accelerator_partition"} {
		if v, ok := str("partition", k); ok {
			part.Compute = strings.ToUpper(v)
		}
	}
	if v, ok := str("partition", "memory_partition"); ok {
		part.Memory = strings.ToUpper(v)
	}
	_, ok1 := amdInt64(amdPath(m, "partition_id"))
	_, ok2 := amdInt64(amdPath(m, "partition", "partition_id"))
	partitioned = ok1 || ok2
	if part.Compute != "" || part.Memory != "" {
		g.Partition = part
	}

	// Limits: flat in older releases ("socket_power"), per power-tracking
	// domain in ROCm 7 ("ppt0": {"socket_power_limit": ...}); ppt0 is the
	// socket limit.
	firstQty := func(paths ...[]string) (float64, bool) {
		for _, p := range paths {
			if v, _, ok := qty(p...); ok {
				return v, true
			}
		}
		return 0, false
	}
	if v, ok := firstQty([]string{"limit", "socket_power"}, []string{"limit", "ppt0", "socket_power_limit"}); ok {
		amdPower(g).LimitW = snapshot.Ptr(v)
	}
	if v, ok := firstQty([]string{"limit", "max_power"}, []string{"limit", "ppt0", "max_power_limit"}); ok {
		amdPower(g).MaxLimitW = snapshot.Ptr(v)
	}
	if v, ok := firstQty([]string{"limit", "min_power"}, []string{"limit", "ppt0", "min_power_limit"}); ok {
		amdPower(g).MinLimitW = snapshot.Ptr(v)
	}
	if v, _, ok := qty("limit", "slowdown_hotspot_temperature"); ok {
		amdTemp(g).SlowdownC = snapshot.Ptr(v)
	} else if v, _, ok := qty("limit", "slowdown_edge_temperature"); ok {
		amdTemp(g).SlowdownC = snapshot.Ptr(v)
	}
	if v, _, ok := qty("limit", "shutdown_hotspot_temperature"); ok {
		amdTemp(g).ShutdownC = snapshot.Ptr(v)
	} else if v, _, ok := qty("limit", "shutdown_edge_temperature"); ok {
		amdTemp(g).ShutdownC = snapshot.Ptr(v)
	}
	if v, _, ok := qty("limit", "slowdown_vram_temperature"); ok {
		amdTemp(g).MemMaxC = snapshot.Ptr(v)
	}

	// Metrics.
	if v, _, ok := qty("usage", "gfx_activity"); ok {
		g.UtilizationGPU = snapshot.Ptr(v)
	}
	if v, _, ok := qty("power", "socket_power"); ok {
		amdPower(g).DrawW = snapshot.Ptr(v)
	}
	if v, _, ok := qty("temperature", "edge"); ok {
		amdTemp(g).EdgeC = snapshot.Ptr(v)
	}
	if v, _, ok := qty("temperature", "hotspot"); ok {
		amdTemp(g).JunctionC = snapshot.Ptr(v)
	}
	if v, _, ok := qty("temperature", "mem"); ok {
		amdTemp(g).MemoryC = snapshot.Ptr(v)
	}
	// Clocks: metric's "clock": {"gfx_0": {"clk": ...}, "mem_0": ...} (and
	// the monitor table's GFX_CLOCK, MEM_CLOCK); static's "clock": {"sys":
	// {"current_frequency": ..., "frequency_levels": {...}}, "mem": ...},
	// whose highest level is the clock's maximum.
	for _, c := range []struct{ metric, static string }{{"gfx_0", "sys"}, {"mem_0", "mem"}} {
		cur, hasCur := firstQty([]string{"clock", c.metric, "clk"}, []string{"clock", c.static, "current_frequency"})
		mx, hasMax := firstQty([]string{"clock", c.metric, "max_clk"})
		if !hasMax {
			mx, hasMax = amdMaxLevel(amdPath(m, "clock", c.static, "frequency_levels"))
		}
		if !hasCur && !hasMax {
			continue
		}
		k := amdClocks(g)
		curP, maxP := &k.GraphicsMHz, &k.MaxGraphicsMHz
		if c.static == "mem" {
			curP, maxP = &k.MemoryMHz, &k.MaxMemoryMHz
		}
		if hasCur {
			*curP = snapshot.Ptr(cur)
		}
		if hasMax {
			*maxP = snapshot.Ptr(mx)
		}
	}

	// ECC: metric's error counts (since the driver loaded) and static's
	// RAS state of the memory controller (UMC) block.
	if n, ok := amdCount(amdPath(m, "ecc", "total_correctable_count")); ok {
		amdECC(g).VolatileCorrectable = snapshot.Ptr(n)
	}
	if n, ok := amdCount(amdPath(m, "ecc", "total_uncorrectable_count")); ok {
		amdECC(g).VolatileUncorrectable = snapshot.Ptr(n)
	}
	if blocks, ok := amdPath(m, "ras", "ecc_block_state").(map[string]any); ok {
		for k, v := range blocks {
			st, _ := amdStr(v)
			if !strings.EqualFold(k, "umc") {
				continue
			}
			switch strings.ToUpper(st) {
			case "ENABLED":
				amdECC(g).Enabled = snapshot.Ptr(true)
			case "DISABLED":
				amdECC(g).Enabled = snapshot.Ptr(false)
			}
		}
	}

	// CPU affinity: one bitmask of 64 CPUs per list, list N covering CPUs
	// 64N..64N+63 (the printed ranges give only the first and last CPU).
	if aff, ok := amdPath(m, "numa", "cpu_affinity").(map[string]any); ok {
		g.CPUAffinity = amdCPUList(aff)
	}
	if n, ok := amdInt64(m["process_count"]); ok && n > 0 && n < 1<<20 {
		g.Processes = int(n)
	}

	if v, ok := str("perf_level"); ok {
		g.PerfLevel = strings.ToLower(strings.TrimPrefix(strings.ToUpper(v), "AMDSMI_DEV_PERF_LEVEL_"))
	}
	pct, _, hasPct := qty("fan", "usage")
	rpm, _, hasRPM := qty("fan", "rpm")
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
	return partitioned
}
