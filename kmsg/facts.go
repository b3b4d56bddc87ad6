package kmsg

import (
	"strings"

	"kiln.dev/kiln/snapshot"
)

// pciAddr matches the PCI address forms of kernel messages: "0000:19:00.0",
// and NVRM's "0000:9b:00" without a function.
const pciAddr = `[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?`

var (
	rePCIEnum   = lazyRegexp(`^pci (` + pciAddr + `): \[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\] type [0-9a-fA-F]{2} class 0x([0-9a-fA-F]{6})`)
	reNVSwProbe = lazyRegexp(`nvidia-nvswitch: Probing device (` + pciAddr + `), Vendor Id = 0x([0-9a-fA-F]{1,4}), Device Id = 0x([0-9a-fA-F]{1,4}), Class = 0x([0-9a-fA-F]{1,6})`)
	reDRMInit   = lazyRegexp(`\[drm\] Initialized (\S+) \S+ \d+ for (` + pciAddr + `) on minor \d+`)
	reGPUAt     = lazyRegexp(`NVRM: GPU at PCI:(` + pciAddr + `): (GPU-[0-9a-fA-F-]{8,})`)
	reSerial    = lazyRegexp(`NVRM: GPU Board Serial Number: (\S+)`)
	reTheGPU    = lazyRegexp(`NVRM: The NVIDIA GPU (` + pciAddr + `)`)
	rePCIID     = lazyRegexp(`\(PCI ID: ([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\)`)
	reNVVersion = lazyRegexp(`Kernel Module(?: for \S+)?\s+(\d{2,4}\.\d{1,3}(?:\.\d{1,3})?)\b`)
)

// drmGPUDrivers are the DRM drivers whose devices are GPUs, with the name
// kiln records as Device.Driver.
var drmGPUDrivers = map[string]string{
	"nvidia-drm": "nvidia-drm",
	"amdgpu":     "amdgpu",
	"i915":       "i915",
	"xe":         "xe",
	"radeon":     "radeon",
	"nouveau":    "nouveau",
}

type factSet struct {
	pci     map[string]*PCIFunction
	devices map[string]*Device
	nvidia  *NVIDIADriver
	// last is the address named by the previous NVRM record, for the
	// serial number and PCI ID lines that follow it.
	last string
}

func (f *factSet) observe(text string) {
	last := f.last
	f.last = ""
	if strings.HasPrefix(text, "pci ") {
		if m := rePCIEnum().FindStringSubmatch(text); m != nil {
			f.addPCI(m[1], m[2], m[3], m[4])
		}
		return
	}
	if strings.Contains(text, "nvidia-nvswitch: Probing") {
		if m := reNVSwProbe().FindStringSubmatch(text); m != nil {
			f.addPCI(m[1], leftPad(m[2], 4), leftPad(m[3], 4), leftPad(m[4], 6))
		}
		return
	}
	if strings.Contains(text, "[drm] Initialized") {
		if m := reDRMInit().FindStringSubmatch(text); m != nil {
			if drv, ok := drmGPUDrivers[m[1]]; ok {
				f.addDevice(Device{Address: m[2], Driver: drv})
			}
		}
		return
	}
	if !strings.Contains(text, "NVRM") {
		return
	}
	if m := reGPUAt().FindStringSubmatch(text); m != nil {
		if a := f.addDevice(Device{Address: m[1], Driver: "nvidia", VendorID: "10de", UUID: m[2]}); a != "" {
			f.last = a
		}
		return
	}
	if m := reSerial().FindStringSubmatch(text); m != nil {
		if d := f.devices[last]; d != nil && d.Serial == "" {
			d.Serial = m[1]
		}
		return
	}
	if m := reTheGPU().FindStringSubmatch(text); m != nil {
		d := Device{Address: m[1], Driver: "nvidia"}
		if id := rePCIID().FindStringSubmatch(text); id != nil {
			d.VendorID, d.DeviceID = strings.ToLower(id[1]), strings.ToLower(id[2])
		}
		f.last = f.addDevice(d)
		return
	}
	if id := rePCIID().FindStringSubmatch(text); id != nil {
		// "NVRM: (PCI ID: 10de:26b5) installed in this system has" printed
		// as its own line after "NVRM: The NVIDIA GPU 0000:b3:00.0".
		if d := f.devices[last]; d != nil && d.DeviceID == "" {
			d.VendorID, d.DeviceID = strings.ToLower(id[1]), strings.ToLower(id[2])
		}
		return
	}
	if strings.Contains(text, "NVIDIA UNIX") {
		if m := reNVVersion().FindStringSubmatch(text); m != nil {
			f.nvidia = &NVIDIADriver{Version: m[1], Open: strings.Contains(text, "Open Kernel Module")}
		}
	}
}

func (f *factSet) addPCI(addr, vendor, device, class string) {
	a, err := snapshot.CanonicalPCI(addr)
	if err != nil {
		return
	}
	if f.pci == nil {
		f.pci = map[string]*PCIFunction{}
	}
	p := f.pci[a]
	if p == nil {
		if len(f.pci) >= maxFacts {
			return
		}
		p = &PCIFunction{Address: a}
		f.pci[a] = p
	}
	p.VendorID, p.DeviceID, p.Class = strings.ToLower(vendor), strings.ToLower(device), strings.ToLower(class)
}

// addDevice records a device and returns its canonical address ("" when
// the address is not one).
func (f *factSet) addDevice(d Device) string {
	a, err := snapshot.CanonicalPCI(d.Address)
	if err != nil {
		return ""
	}
	d.Address = a
	if f.devices == nil {
		f.devices = map[string]*Device{}
	}
	o := f.devices[a]
	if o == nil {
		if len(f.devices) >= maxFacts {
			return ""
		}
		f.devices[a] = &d
		return a
	}
	// The nvidia core module's name wins over its DRM front end's.
	if o.Driver == "" || (o.Driver == "nvidia-drm" && d.Driver == "nvidia") {
		o.Driver = d.Driver
	}
	for _, p := range []struct {
		dst *string
		src string
	}{
		{&o.VendorID, d.VendorID}, {&o.DeviceID, d.DeviceID}, {&o.UUID, d.UUID}, {&o.Serial, d.Serial},
	} {
		if *p.dst == "" {
			*p.dst = p.src
		}
	}
	return a
}
