package capture

import (
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"

	"kiln.dev/kiln/kmsg"
	"kiln.dev/kiln/snapshot"
)

// The dmesg importer reads kernel logs (dmesg in its plain, -T and --decode
// --time-format iso forms, journalctl -k, /dev/kmsg copies) into the events
// they hold, plus the GPUs, NVSwitches and NVIDIA kernel module the boot
// messages name.
func init() {
	RegisterFile(FileImporter{Kind: "dmesg", Detect: detectDmesg, Generic: true,
		Parse: func(name string, data []byte) (*snapshot.Snapshot, error) {
			return parseDmesg(name, bytes.NewReader(data))
		},
		ParseReader: parseDmesg,
	})
}

func detectDmesg(_ string, data []byte) bool { return kmsg.Sniff(data) }

// gpuVendors maps the PCI vendor ids of GPU makers to kiln's vendor names.
var gpuVendors = map[string]string{
	"10de": snapshot.VendorNVIDIA,
	"1002": snapshot.VendorAMD,
	"8086": snapshot.VendorIntel,
}

// driverVendors maps the drivers that name GPUs in a log to their vendor.
var driverVendors = map[string]string{
	"nvidia":     snapshot.VendorNVIDIA,
	"nvidia-drm": snapshot.VendorNVIDIA,
	"nouveau":    snapshot.VendorNVIDIA,
	"amdgpu":     snapshot.VendorAMD,
	"radeon":     snapshot.VendorAMD,
	"i915":       snapshot.VendorIntel,
	"xe":         snapshot.VendorIntel,
}

func parseDmesg(_ string, r io.Reader) (*snapshot.Snapshot, error) {
	l, err := kmsg.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("kernel log: %w", err)
	}
	s := snapshot.New()
	s.Events = l.Events
	// Say what was read: a log with no GPU line is an answer too.
	what := "no GPU event found"
	if n := len(l.Events) + l.Dropped; n > 0 {
		for _, e := range l.Events {
			n += e.Repeats
		}
		what = fmt.Sprintf("%d GPU and PCIe %s", n, plural(n, "event", "events"))
	}
	s.Notes = append(s.Notes, snapshot.Note{Source: "dmesg",
		Message: fmt.Sprintf("read %d lines of kernel log (%s): %s, %d GPUs named", l.Lines, l.Format, what, len(logGPUs(l.Facts)))})
	if l.Dropped > 0 {
		s.Notes = append(s.Notes, snapshot.Note{Source: "dmesg",
			Message: fmt.Sprintf("kernel log holds more than %d GPU events; %d later ones were not kept", kmsg.MaxEvents, l.Dropped)})
	}
	s.GPUs = logGPUs(l.Facts)
	for _, p := range l.PCI {
		if isNVSwitch(p) {
			s.PCI = append(s.PCI, snapshot.PCIDevice{Address: p.Address, VendorID: p.VendorID, DeviceID: p.DeviceID,
				Class: p.Class, Kind: snapshot.KindNVSwitch})
		}
	}
	if n := l.NVIDIA; n != nil {
		s.Drivers.NVIDIAKernel = n.Version
		s.Drivers.NVIDIAOpenKernel = snapshot.Ptr(n.Open)
	}
	return s, nil
}

// isNVSwitch: NVIDIA's functions of class 0680 ("bridge, other") are its
// NVSwitches (10de:1af1 on A100 boards, 10de:22a3 on H100 boards).
func isNVSwitch(p kmsg.PCIFunction) bool {
	return p.VendorID == "10de" && strings.HasPrefix(p.Class, "0680")
}

// logGPUs lists the GPUs a log names: display-class functions of GPU
// vendors enumerated at boot, and devices a GPU driver bound or reported
// (the nvidia-drm/amdgpu "Initialized ... for <address>" lines, NVRM's "GPU
// at PCI:<address>: GPU-<uuid>"). A PCI bridge or NVSwitch is never one.
func logGPUs(f kmsg.Facts) []snapshot.GPU {
	byAddr := map[string]*snapshot.GPU{}
	for _, p := range f.PCI {
		vendor, ok := gpuVendors[p.VendorID]
		if !ok || !strings.HasPrefix(p.Class, "03") {
			continue
		}
		byAddr[p.Address] = &snapshot.GPU{Vendor: vendor, PCIAddress: p.Address, DeviceID: p.DeviceID}
	}
	for _, d := range f.Devices {
		vendor := driverVendors[d.Driver]
		if v, ok := gpuVendors[d.VendorID]; ok {
			vendor = v
		}
		if vendor == "" {
			continue
		}
		g := byAddr[d.Address]
		if g == nil {
			g = &snapshot.GPU{Vendor: vendor, PCIAddress: d.Address}
			byAddr[d.Address] = g
		}
		if g.DeviceID == "" {
			g.DeviceID = d.DeviceID
		}
		g.UUID, g.Serial = d.UUID, d.Serial
	}
	addrs := make([]string, 0, len(byAddr))
	for a := range byAddr {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	gpus := make([]snapshot.GPU, 0, len(addrs))
	for i, a := range addrs {
		g := byAddr[a]
		g.Index = i
		gpus = append(gpus, *g)
	}
	return gpus
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
