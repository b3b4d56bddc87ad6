package capture

import (
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// rocm-smi prints what it could not do between its tables: "ERROR: GPU[0] :
// sclk clock is unsupported", "GPU[0] : get_power_cap, Not supported on the
// given system", "ERROR: 15 GPU[0]: power: Data (usually from reading a
// file) was not of the type that was expected", "Expected integer value
// from monitor, but got \"\"", "WARNING: One or more commands failed".
// A query the device does not support (an APU has no power cap, a partition
// reports device metrics only on its first partition) is normal; a read
// that failed on a device from which nothing else could be read either is
// the tool's report that the GPU does not answer.

type rocmMsg int

const (
	rocmMsgNone   rocmMsg = iota
	rocmMsgNote           // a warning or an unsupported query
	rocmMsgRead           // a read that failed
	rocmMsgDriver         // the tool could not reach the driver
)

var rocmMsgGPU = lazy(`GPU\[(\d+)\]`)

// rocmReadFailures are the phrases of failed reads (rsmi status strings and
// the CLI's own messages), lower case.
var rocmReadFailures = []string{
	"was not of the type that was expected", // RSMI_STATUS_UNEXPECTED_DATA
	"expected integer value from monitor",
	"problem accessing a file", // RSMI_STATUS_FILE_ERROR
	"no data was found",        // RSMI_STATUS_NO_DATA
	"was not of the expected size",
	"an internal exception was caught",
	"unable to read", "failed to read", "could not read", "cannot read",
}

// rocmDriverFailures say the tool could not reach the amdgpu driver.
var rocmDriverFailures = []string{
	"driver not initialized", "amdgpu not found in modules", "drivers not loaded",
	"error occurred when rsmi initializing", "rsmi_init failed",
}

// rocmClassify says what kind of message a line is, the device it names
// (-1 for none) and its text with runs of blanks made one space.
func rocmClassify(line string) (rocmMsg, int, string) {
	msg := strings.Join(strings.Fields(line), " ")
	low := strings.ToLower(msg)
	gpu := -1
	if m := rocmMsgGPU().FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n <= rocmMaxIndex {
			gpu = n
		}
	}
	for _, f := range rocmDriverFailures {
		if strings.Contains(low, f) {
			return rocmMsgDriver, gpu, msg
		}
	}
	if strings.Contains(low, "not supported") || strings.Contains(low, "unsupported") || strings.Contains(low, "not implemented") {
		return rocmMsgNote, gpu, msg
	}
	for _, f := range rocmReadFailures {
		if strings.Contains(low, f) {
			return rocmMsgRead, gpu, msg
		}
	}
	if strings.HasPrefix(msg, "ERROR") || strings.HasPrefix(msg, "WARNING") {
		return rocmMsgNote, gpu, msg
	}
	// "GPU[0] : get_power_cap, ..." (a message, not a "Key: value" pair).
	if strings.HasPrefix(msg, "GPU[") {
		if _, rest, ok := strings.Cut(msg, "]"); ok {
			rest = strings.TrimLeft(rest, " :")
			if !strings.Contains(rest, ":") && strings.Contains(rest, ",") {
				return rocmMsgNote, gpu, msg
			}
		}
	}
	return rocmMsgNone, gpu, msg
}

// maxRocmNotes bounds the messages one file keeps as notes.
const maxRocmNotes = 256

// message records a line if it is one of the tool's messages.
func (p *rocmTextParser) message(line string) bool {
	kind, gpu, msg := rocmClassify(line)
	if kind == rocmMsgNone {
		return false
	}
	if !p.noted[msg] && len(p.noted) < maxRocmNotes {
		if p.noted == nil {
			p.noted = map[string]bool{}
		}
		p.noted[msg] = true
		p.s.Notes = append(p.s.Notes, snapshot.Note{Source: "rocm-smi", Message: msg})
	}
	switch kind {
	case rocmMsgRead:
		if gpu >= 0 && len(p.fails[gpu]) < 16 {
			p.fails[gpu] = append(p.fails[gpu], msg)
		} else if gpu < 0 && len(p.failAny) < 16 {
			p.failAny = append(p.failAny, msg)
		}
	case rocmMsgDriver:
		if len(p.driver) < 16 {
			p.driver = append(p.driver, msg)
		}
	}
	return true
}

// toolErrors turns the failures into tool-error events: the driver could
// not be reached, or a device's concise row read nothing while the tool
// printed read failures (for it, or for no device in particular). What such
// a row shows besides (Fan 0%, GPU% 0%) is what the failed reads left, not
// a reading, and is dropped.
func (p *rocmTextParser) toolErrors() {
	if len(p.driver) > 0 {
		p.s.Events = append(p.s.Events, snapshot.Event{Source: "rocm-smi", Kind: snapshot.EventToolError,
			Reason: snapshot.ToolDriverUnreachable, Message: rocmJoin(p.driver)})
	}
	for i := range p.s.GPUs {
		g := &p.s.GPUs[i]
		idx := g.Index
		if p.concise[idx] == nil || p.read[idx] || rocmReadAnything(g) {
			continue
		}
		msgs := p.fails[idx]
		// A partition other than the first reads nothing by design: only
		// failures the tool named it in count for it.
		if pid, ok := p.partID[idx]; !ok || pid == 0 {
			msgs = append(append([]string(nil), msgs...), p.failAny...)
		}
		if len(msgs) == 0 {
			continue
		}
		p.s.Events = append(p.s.Events, snapshot.Event{Source: "rocm-smi", Kind: snapshot.EventToolError,
			Reason: snapshot.ToolGPUError, Device: g.PCIAddress,
			Message: "GPU[" + strconv.Itoa(idx) + "]: no temperature, power or clock could be read: " + rocmJoin(msgs)})
		g.Fans, g.UtilizationGPU, g.MemoryUsedPercent = nil, nil, nil
	}
}

// rocmReadAnything says whether a GPU holds a measurement.
func rocmReadAnything(g *snapshot.GPU) bool {
	return g.Temperature != nil || g.Clocks != nil || (g.Power != nil && g.Power.DrawW != nil)
}

// rocmJoin joins distinct messages, at most three.
func rocmJoin(msgs []string) string {
	var out []string
	seen := map[string]bool{}
	for _, m := range msgs {
		if !seen[m] && len(out) < 3 {
			seen[m] = true
			out = append(out, m)
		}
	}
	return strings.Join(out, "; ")
}

// rocmFoldPartitions folds the partitions rocm-smi lists as devices of
// their own into one GPU per physical device: a device with the same PCI
// address as one before it, or whose partition id follows that of the
// device just before it (CPX rows 0-7: ids 0, 1, ... 7), is a partition of
// that device. Partition 0 carries the device-wide readings.
func rocmFoldPartitions(gpus []snapshot.GPU, partID map[int]int) []snapshot.GPU {
	var out []snapshot.GPU
	size := []int{}
	lastPID := []int{}
	byAddr := map[string]int{}
	for _, g := range gpus {
		pid, hasPID := partID[g.Index]
		parent := -1
		if j, ok := byAddr[g.PCIAddress]; ok && g.PCIAddress != "" {
			parent = j
		} else if hasPID && pid > 0 && len(out) > 0 && lastPID[len(out)-1] == pid-1 {
			if o := out[len(out)-1]; o.PCIAddress == "" || g.PCIAddress == "" || o.PCIAddress[:len(o.PCIAddress)-2] == g.PCIAddress[:len(g.PCIAddress)-2] {
				parent = len(out) - 1
			}
		}
		if parent < 0 {
			if g.PCIAddress != "" {
				byAddr[g.PCIAddress] = len(out)
			}
			out = append(out, g)
			size = append(size, 1)
			lastPID = append(lastPID, pidOr(pid, hasPID))
			continue
		}
		o := &out[parent]
		size[parent]++
		lastPID[parent] = pidOr(pid, hasPID)
		o.KFDNodes = append(o.KFDNodes, g.KFDNodes...)
		if o.Partition == nil && g.Partition != nil {
			p := *g.Partition
			o.Partition = &p
		}
	}
	for i := range out {
		out[i].Index = i
		sort.Ints(out[i].KFDNodes)
		if size[i] > 1 {
			if out[i].Partition == nil {
				out[i].Partition = &snapshot.Partition{}
			} else {
				p := *out[i].Partition
				out[i].Partition = &p
			}
			out[i].Partition.Count = size[i]
		} else if p := out[i].Partition; p != nil && p.Compute == "SPX" {
			c := *p
			c.Count = 1
			out[i].Partition = &c
		}
	}
	return out
}

func pidOr(pid int, ok bool) int {
	if ok {
		return pid
	}
	return -2
}
