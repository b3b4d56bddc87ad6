package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "driver",
		IDs:  []string{"driver-mismatch", "driver-too-old", "nouveau-loaded", "fabric-manager-missing"},
		Doc:  "Driver stack consistency: kernel module versus user space, toolkits the driver cannot run, nouveau, and the fabric manager on NVSwitch systems.",
		Run:  checkDriver,
	})
}

func checkDriver(in *Input) []Finding {
	s := in.Snapshot
	d := s.Drivers
	var out []Finding
	nv := nvidiaGPUs(s)
	mismatch := toolErrors(s, snapshot.ToolVersionMismatch)
	if (d.NVIDIAKernel != "" && d.NVIDIAUser != "" && d.NVIDIAKernel != d.NVIDIAUser) || len(mismatch) > 0 {
		f := Finding{
			ID: "driver-mismatch", Severity: Critical, Devices: addrs(nv),
			Title:  fmt.Sprintf("NVIDIA kernel module %s and user-space driver %s differ", orWord(d.NVIDIAKernel, "(version unknown)"), orWord(d.NVIDIAUser, "(version unknown)")),
			Impact: "NVML and CUDA refuse to start (\"Failed to initialize NVML: Driver/library version mismatch\"): no job can use the GPUs",
			Remedy: "Reboot so that the kernel module installed with the new driver loads (or unload and reload the nvidia modules with no GPU process running).",
		}
		if d.NVIDIAKernel != "" && d.NVIDIAUser != "" {
			f.Evidence = []string{"kernel module: " + d.NVIDIAKernel, "user-space (NVML/libcuda): " + d.NVIDIAUser}
		} else {
			f.Title = "the NVIDIA kernel module and the user-space driver are of different versions"
		}
		f.Evidence = append(f.Evidence, eventLines(mismatch, 3)...)
		out = append(out, f)
	}
	if f, ok := driverTooOld(in.KB, d, nv); ok {
		out = append(out, f)
	}
	if isTrue(d.NouveauLoaded) && len(nv) > 0 {
		sev := Warning
		if d.NVIDIAKernel == "" {
			sev = Critical
		}
		out = append(out, Finding{
			ID: "nouveau-loaded", Severity: sev, Devices: addrs(nv),
			Title:    "the nouveau driver is loaded on a node with NVIDIA GPUs",
			Evidence: []string{"module nouveau is loaded", "NVIDIA kernel module: " + orWord(d.NVIDIAKernel, "not loaded")},
			Impact:   "nouveau claims the GPUs so that the NVIDIA driver cannot bind them; CUDA jobs cannot run",
			Remedy:   "Blacklist nouveau (blacklist nouveau and options nouveau modeset=0 in /etc/modprobe.d), rebuild the initramfs and reboot.",
		})
	}
	if f, ok := fabricManager(in, s, nv); ok {
		out = append(out, f)
	}
	return out
}

func nvidiaGPUs(s *snapshot.Snapshot) []*snapshot.GPU {
	var out []*snapshot.GPU
	for _, g := range gpus(s) {
		if g.Vendor == snapshot.VendorNVIDIA {
			out = append(out, g)
		}
	}
	return out
}

// driverTooOld compares the driver with the CUDA toolkits found on the node.
func driverTooOld(k *kb.KB, d snapshot.Drivers, nv []*snapshot.GPU) (Finding, bool) {
	drv := d.NVIDIAUser
	if drv == "" {
		drv = d.NVIDIAKernel
	}
	if drv == "" {
		return Finding{}, false
	}
	var ev []string
	need := ""
	for _, t := range d.Toolkits {
		if t.Kind != "cuda" {
			continue
		}
		rel, ok := k.MinDriverForCUDA(t.Version)
		if !ok {
			continue
		}
		if kb.CompareDriver(drv, rel.MinDriverLinux) >= 0 {
			continue
		}
		compat := rel.MinorCompatDriver != "" && kb.CompareDriver(drv, rel.MinorCompatDriver) >= 0
		line := fmt.Sprintf("CUDA %s at %s needs driver >= %s", t.Version, orWord(t.Path, "the node"), rel.MinDriverLinux)
		if compat {
			line += fmt.Sprintf(" (runs under minor-version compatibility from %s, without PTX JIT of newer code)", rel.MinorCompatDriver)
		}
		ev = append(ev, line)
		if need == "" || kb.CompareDriver(rel.MinDriverLinux, need) > 0 {
			need = rel.MinDriverLinux
		}
	}
	if len(ev) == 0 {
		return Finding{}, false
	}
	maxCUDA := k.MaxCUDAForDriver(drv)
	return Finding{
		ID: "driver-too-old", Severity: Warning, Devices: addrs(nv),
		Title:     fmt.Sprintf("driver %s is older than the CUDA toolkits on this node need", drv),
		Evidence:  append(ev, fmt.Sprintf("driver %s supports CUDA up to %s", drv, orWord(maxCUDA, "an unknown version"))),
		Impact:    "programs built with the newer toolkit fail with \"CUDA driver version is insufficient for CUDA runtime version\" or lose features",
		Remedy:    fmt.Sprintf("Upgrade the driver to >= %s, or use a toolkit the driver supports (up to CUDA %s).", need, orWord(maxCUDA, "?")),
		Reference: "NVIDIA CUDA Toolkit release notes, table of minimum driver versions",
	}, true
}

func fabricManager(in *Input, s *snapshot.Snapshot, nv []*snapshot.GPU) (Finding, bool) {
	switches := 0
	for _, d := range s.PCI {
		if d.Kind == snapshot.KindNVSwitch {
			switches++
		}
	}
	needs := switches > 0
	for _, g := range nv {
		if m, ok := in.KB.GPUByDeviceID(g.Vendor, g.DeviceID); ok && m.NVSwitch {
			needs = true
		}
		for _, l := range g.NVLinks {
			if l.RemoteKind == "nvswitch" {
				needs = true
			}
		}
	}
	fm := s.Drivers.FabricManager
	if !needs || fm == nil {
		return Finding{}, false
	}
	var ev []string
	bad := false
	if isFalse(fm.Installed) {
		ev = append(ev, "nv-fabricmanager is not installed")
		bad = true
	} else if isFalse(fm.Running) {
		ev = append(ev, "nv-fabricmanager is not running")
		bad = true
	}
	st := strings.ToLower(fm.State)
	if fm.State != "" && st != "completed" && st != "n/a" {
		ev = append(ev, "GPU fabric state: "+fm.State)
		bad = true
	}
	if fm.Status != "" && !strings.EqualFold(fm.Status, "success") && !strings.EqualFold(fm.Status, "n/a") {
		ev = append(ev, "GPU fabric status: "+fm.Status)
		bad = true
	}
	if !bad {
		return Finding{}, false
	}
	if switches > 0 {
		ev = append(ev, fmt.Sprintf("%d NVSwitches on the PCI bus", switches))
	}
	return Finding{
		ID: "fabric-manager-missing", Severity: Critical, Devices: addrs(nv),
		Title:     "NVSwitch system without a working fabric manager",
		Evidence:  ev,
		Impact:    "on NVSwitch systems CUDA cannot use the GPUs (cudaErrorSystemNotReady) until the fabric manager has configured the NVLink fabric",
		Remedy:    "Install the nvidia-fabricmanager package matching the driver version exactly and enable it (systemctl enable --now nvidia-fabricmanager).",
		Reference: "NVIDIA Fabric Manager user guide",
	}, true
}
