package discover

import (
	"encoding/json"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// readDrivers fills s.Drivers: kernel modules, the NVIDIA proc file, ROCm
// and CUDA toolkits, and the fabric manager. It runs after the PCI walk so
// that its notes can say which missing piece matters.
func readDrivers(r *reader, s *snapshot.Snapshot) {
	d := &s.Drivers
	hasNVIDIA := hasVendor(s, snapshot.VendorNVIDIA)
	hasAMD := hasVendor(s, snapshot.VendorAMD)

	modulesListable := r.exists("sys/module")
	nvidiaLoaded := r.exists("sys/module/nvidia")
	if v, ok := r.readString("sys/module/nvidia/version"); ok {
		d.NVIDIAKernel = v
	}
	if b, err := r.readFile("proc/driver/nvidia/version"); err == nil {
		ver, open, ok := ParseNVIDIAProcVersion(string(b))
		if ok {
			if d.NVIDIAKernel == "" {
				d.NVIDIAKernel = ver
			}
			d.NVIDIAOpenKernel = snapshot.Ptr(open)
		}
		nvidiaLoaded = true
	}
	if hasNVIDIA && !nvidiaLoaded && modulesListable {
		note(s, "sysfs", "no NVIDIA driver loaded: /sys/module/nvidia absent")
	}
	if modulesListable {
		d.NouveauLoaded = snapshot.Ptr(r.exists("sys/module/nouveau"))
		if *d.NouveauLoaded && hasNVIDIA {
			note(s, "sysfs", "nouveau is loaded: CUDA needs the NVIDIA driver, and nouveau holds the GPUs it binds")
		}
		amdLoaded := r.exists("sys/module/amdgpu")
		if v, ok := r.readString("sys/module/amdgpu/version"); ok {
			d.AMDGPU = v
		}
		if hasAMD && !amdLoaded {
			note(s, "sysfs", "no AMD GPU driver loaded: /sys/module/amdgpu absent")
		}
	}

	if v, ok := r.readString("opt/rocm/.info/version"); ok && v != "" {
		d.ROCm = v
		d.Toolkits = append(d.Toolkits, snapshot.Toolkit{Kind: "rocm", Version: v, Path: "/opt/rocm"})
	}
	d.Toolkits = append(d.Toolkits, readCUDAToolkits(r)...)

	if hasNVIDIA || nvidiaLoaded || hasNVSwitch(s) {
		fm := &snapshot.FabricManager{}
		fm.Installed = snapshot.Ptr(r.exists("usr/bin/nv-fabricmanager"))
		if running, ok := processRunning(r, "nv-fabricmanager"); ok {
			fm.Running = snapshot.Ptr(running)
		}
		d.FabricManager = fm
	}
}

var procVersionRe = regexp.MustCompile(`\s(\d+\.\d+(?:\.\d+)?)\s`)

// ParseNVIDIAProcVersion reads /proc/driver/nvidia/version's NVRM line:
// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.129.03
// Release Build ..." (open modules) or "NVRM version: NVIDIA UNIX x86_64
// Kernel Module  535.129.03  Tue Oct ..." (proprietary).
func ParseNVIDIAProcVersion(text string) (version string, open bool, ok bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "NVRM version:") {
			continue
		}
		m := procVersionRe.FindStringSubmatch(line + " ")
		if m == nil {
			return "", false, false
		}
		return m[1], strings.Contains(line, "Open Kernel Module"), true
	}
	return "", false, false
}

func hasNVSwitch(s *snapshot.Snapshot) bool {
	for _, p := range s.PCI {
		if p.Kind == snapshot.KindNVSwitch {
			return true
		}
	}
	return false
}

// readCUDAToolkits finds /usr/local/cuda*/version.json (CUDA 11.1 and
// later) or version.txt (older). /usr/local/cuda is usually a link to one
// of the versioned directories; it is counted once.
func readCUDAToolkits(r *reader) []snapshot.Toolkit {
	es, err := r.readDir("usr/local")
	if err != nil {
		return nil
	}
	names := map[string]bool{}
	for _, e := range es {
		names[e.Name()] = true
	}
	var out []snapshot.Toolkit
	for _, e := range es {
		name := e.Name()
		if !strings.HasPrefix(name, "cuda") {
			continue
		}
		dir := "usr/local/" + name
		if e.Type()&fs.ModeSymlink != 0 {
			// Keep the link (not what it points to) only when it is
			// skipped; otherwise its files are recorded as plain files.
			if t, err := os.Readlink(r.abs(dir)); err == nil && names[path.Base(t)] && path.Base(t) != name {
				r.rec.addLink(dir, t)
				continue
			}
		}
		v := ""
		if b, err := r.readFile(dir + "/version.json"); err == nil {
			v = ParseCUDAVersionJSON(b)
		} else if b, err := r.readFile(dir + "/version.txt"); err == nil {
			v = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "CUDA Version"))
		}
		if v != "" {
			out = append(out, snapshot.Toolkit{Kind: "cuda", Version: v, Path: "/" + dir})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// ParseCUDAVersionJSON returns the "cuda" component's version from a CUDA
// toolkit's version.json, or "" when absent.
func ParseCUDAVersionJSON(b []byte) string {
	var v map[string]struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return ""
	}
	return v["cuda"].Version
}

// processRunning looks for a process whose /proc/<pid>/comm is name. ok
// is false when /proc cannot be listed. Only the matching comm file is
// kept in a recording.
func processRunning(r *reader, name string) (running, ok bool) {
	es, err := r.readDir("proc")
	if err != nil {
		return false, false
	}
	for _, e := range es {
		pid := e.Name()
		if pid == "" || strings.Trim(pid, "0123456789") != "" {
			continue
		}
		rel := "proc/" + pid + "/comm"
		b, err := readUnrecorded(r, rel)
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		r.rec.addFile(rel, b)
		return true, true
	}
	return false, true
}
