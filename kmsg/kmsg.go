// Package kmsg reads Linux kernel logs and finds the events in them that
// concern GPUs, NVSwitches and the PCIe fabric: NVIDIA Xid and SXid errors,
// GPUs fallen off the bus, failed driver probes, amdgpu faults and PCIe AER
// reports. It also keeps the boot facts a log states about the machine: PCI
// functions enumerated, GPUs named by their drivers, and the NVIDIA kernel
// module version.
//
// It accepts the forms admins have at hand: plain dmesg ("[ 1234.567890]
// text"), dmesg -T ("[Sun Feb 23 16:24:18 2025] text"), dmesg --decode
// --time-format iso ("kern  :err   : 2025-01-17T15:36:15,345059+00:00
// text"), journalctl -k and syslog files ("Feb 27 15:10:02 host kernel:
// text"), and /dev/kmsg records ("6,1234,5678901,-;text"). Input is read line
// by line; memory stays bounded however long the log is.
//
// An event's Message starts with the line that reported it (a report the
// kernel wrapped over several lines is joined into one); the detail lines
// that belong to it, such as an Xid's GSP RPC history dump or the status
// lines of an AER report, follow one per line, within a bounded size.
package kmsg

import (
	"errors"
	"io"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Limits that keep memory bounded on very long or hostile logs.
const (
	// MaxLine is the longest line kept; the rest of a longer line is dropped.
	MaxLine = 64 << 10
	// MaxEvents is the most events Parse keeps; further ones are counted in
	// Log.Dropped.
	MaxEvents = 1 << 16
	// maxMessage bounds one event's message, detail lines included.
	maxMessage = 4096
	// maxDetail bounds the detail lines joined to one event.
	maxDetail = 64
	// maxParts bounds the continuation lines joined to one record.
	maxParts = 32
	// maxFacts bounds the PCI functions and devices remembered.
	maxFacts = 8192
)

// PCIFunction is one PCI function the kernel enumerated at boot
// ("pci 0000:19:00.0: [10de:2330] type 00 class 0x030200").
type PCIFunction struct {
	Address  string `json:"address"`   // canonical dddd:bb:dd.f
	VendorID string `json:"vendor_id"` // "10de"
	DeviceID string `json:"device_id"` // "2330"
	// Class is the 6-hex-digit class code ("030200").
	Class string `json:"class,omitempty"`
}

// Device is a GPU a driver named in the log: "[drm] Initialized nvidia-drm
// ... for 0000:19:00.0", "NVRM: GPU at PCI:0000:9b:00: GPU-...", "NVRM: The
// NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)".
type Device struct {
	Address string `json:"address"`
	// Driver is the kernel driver that named it: nvidia, nvidia-drm, amdgpu,
	// i915, xe, radeon, nouveau.
	Driver   string `json:"driver"`
	VendorID string `json:"vendor_id,omitempty"`
	DeviceID string `json:"device_id,omitempty"`
	UUID     string `json:"uuid,omitempty"`
	Serial   string `json:"serial,omitempty"`
}

// NVIDIADriver is the NVIDIA kernel module a log shows loading.
type NVIDIADriver struct {
	Version string `json:"version"`
	// Open is true for the open kernel modules ("NVIDIA UNIX Open Kernel
	// Module"), false for the proprietary ones.
	Open bool `json:"open"`
}

// Facts are what a kernel log states about the machine besides events.
type Facts struct {
	PCI     []PCIFunction `json:"pci,omitempty"`
	Devices []Device      `json:"devices,omitempty"`
	// NVIDIA is the last NVIDIA kernel module load the log shows; nil if none.
	NVIDIA *NVIDIADriver `json:"nvidia,omitempty"`
	// Lines is the number of lines read.
	Lines int `json:"lines"`
	// Format is the form of the first timestamped line: dmesg, dmesg-iso,
	// dmesg-ctime, journal, kmsg; "text" when no line had a known prefix.
	Format string `json:"format"`
}

// Log is a parsed kernel log.
type Log struct {
	Events []snapshot.Event `json:"events"`
	Facts
	// Dropped counts events past MaxEvents that were not kept.
	Dropped int `json:"dropped,omitempty"`
}

// Parse reads a whole kernel log. It fails only when r fails; lines it does
// not understand are skipped.
func Parse(r io.Reader) (*Log, error) {
	rd := NewReader(r)
	l := &Log{}
	// A storm repeats one event thousands of times: past the first few of
	// a kind on a device, each keeps only its first line, so memory follows
	// the number of events, not their dumps.
	type key struct {
		kind, dev string
		code      int
	}
	seen := map[key]int{}
	// last is where the newest event of a key past keepPerKind sits: it
	// stands for the ones not kept (Repeats).
	last := map[key]int{}
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(l.Events) >= MaxEvents {
			l.Dropped++
			continue
		}
		k := key{ev.Kind, ev.Device, ev.Code}
		seen[k]++
		if seen[k] > fullEvents {
			ev.Message = shortMessage(ev.Message)
		}
		if seen[k] > keepPerKind {
			i := last[k]
			ev.Repeats = l.Events[i].Repeats + 1
			l.Events[i] = ev
			continue
		}
		if seen[k] == keepPerKind {
			last[k] = len(l.Events)
		}
		l.Events = append(l.Events, ev)
	}
	l.Facts = rd.Facts()
	return l, nil
}

// keepPerKind is how many events of one kind, code and device are kept;
// the newest of the rest stands for them all (Event.Repeats counts them).
const keepPerKind = 512

// fullEvents is how many events of one kind, code and device keep their
// whole message.
const fullEvents = 16

// shortMessage keeps a message's first line, at most 256 bytes of it.
func shortMessage(m string) string {
	if i := strings.IndexByte(m, '\n'); i >= 0 {
		m = m[:i]
	}
	if len(m) > 256 {
		m = strings.ToValidUTF8(m[:256], "")
	}
	return strings.Clone(m)
}

// Facts returns the boot facts seen so far, sorted by address.
func (r *Reader) Facts() Facts {
	f := Facts{Lines: r.lines, Format: r.format}
	if f.Format == "" {
		f.Format = "text"
	}
	for _, p := range r.facts.pci {
		f.PCI = append(f.PCI, *p)
	}
	sort.Slice(f.PCI, func(i, j int) bool { return f.PCI[i].Address < f.PCI[j].Address })
	for _, d := range r.facts.devices {
		f.Devices = append(f.Devices, *d)
	}
	sort.Slice(f.Devices, func(i, j int) bool { return f.Devices[i].Address < f.Devices[j].Address })
	if r.facts.nvidia != nil {
		n := *r.facts.nvidia
		f.NVIDIA = &n
	}
	return f
}
