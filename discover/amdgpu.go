package discover

import (
	"path"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// readAMDGPUs fills the amdgpu driver's sysfs attributes of every AMD GPU:
// memory, VBIOS, board FRU fields, utilization, PCIe replays and the hwmon
// sensors. Attributes the driver does not offer on an ASIC stay unknown.
func readAMDGPUs(r *reader, s *snapshot.Snapshot) {
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if g.Vendor != snapshot.VendorAMD {
			continue
		}
		dir := gpuDir(r, g.PCIAddress)
		if dir == "" {
			continue
		}
		readAMDGPU(r, dir, g)
	}
}

// gpuDir returns the resolved sysfs directory of a PCI address.
func gpuDir(r *reader, addr string) string {
	link := "sys/bus/pci/devices/" + addr
	t, err := r.readLink(link)
	if err != nil {
		return link
	}
	if path.IsAbs(t) {
		return cleanRel(t)
	}
	return cleanRel(path.Join(path.Dir(link), t))
}

func readAMDGPU(r *reader, dir string, g *snapshot.GPU) {
	if n, ok := readUint(r, dir+"/mem_info_vram_total"); ok {
		g.MemoryTotalBytes = n
	}
	if n, ok := readUint(r, dir+"/mem_info_vram_used"); ok {
		g.MemoryUsedBytes = n
	}
	if v, ok := r.readString(dir + "/vbios_version"); ok && v != "" {
		g.VBIOS = v
	}
	if v, ok := r.readString(dir + "/unique_id"); ok && v != "" {
		g.UUID = v
	}
	if v, ok := r.readString(dir + "/serial_number"); ok && v != "" {
		g.Serial = v
	}
	if v, ok := r.readString(dir + "/product_name"); ok && v != "" {
		g.Model = v
	}
	if v, ok := r.readString(dir + "/product_number"); ok && v != "" {
		g.BoardPart = v
	}
	if n, ok := readUint(r, dir+"/gpu_busy_percent"); ok && n <= 100 {
		g.UtilizationGPU = snapshot.Ptr(float64(n))
	}
	if n, ok := readUint(r, dir+"/pcie_replay_count"); ok {
		if g.PCIe == nil {
			g.PCIe = &snapshot.PCIeLink{}
		}
		g.PCIe.Replays = snapshot.Ptr(n)
	}
	hw := hwmonDir(r, dir)
	if hw == "" {
		return
	}
	readAMDHwmon(r, hw, g)
}

// hwmonDir returns the first hwmon directory of a device.
func hwmonDir(r *reader, dir string) string {
	es, err := r.readDir(dir + "/hwmon")
	if err != nil {
		return ""
	}
	var names []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), "hwmon") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return dir + "/hwmon/" + names[0]
}

// readAMDHwmon reads amdgpu's hwmon sensors: temp1 edge, temp2 junction,
// temp3 memory (labels win when present), millidegrees; power in
// microwatts; fan in RPM.
func readAMDHwmon(r *reader, hw string, g *snapshot.GPU) {
	t := &snapshot.Temperature{}
	for ch := 1; ch <= 3; ch++ {
		c, ok := readMilli(r, hw+"/temp"+strconv.Itoa(ch)+"_input")
		if !ok {
			continue
		}
		label, _ := r.readString(hw + "/temp" + strconv.Itoa(ch) + "_label")
		if label == "" {
			label = [...]string{"", "edge", "junction", "mem"}[ch]
		}
		switch strings.ToLower(label) {
		case "edge":
			t.EdgeC = snapshot.Ptr(c)
			if crit, ok := readMilli(r, hw+"/temp"+strconv.Itoa(ch)+"_crit"); ok {
				t.CriticalC = snapshot.Ptr(crit)
			}
		case "junction":
			t.JunctionC = snapshot.Ptr(c)
		case "mem":
			t.MemoryC = snapshot.Ptr(c)
		}
	}
	if *t != (snapshot.Temperature{}) {
		g.Temperature = t
	}
	p := &snapshot.Power{}
	if n, ok := readUint(r, hw+"/power1_average"); ok {
		p.DrawW = snapshot.Ptr(float64(n) / 1e6)
	} else if n, ok := readUint(r, hw+"/power1_input"); ok {
		p.DrawW = snapshot.Ptr(float64(n) / 1e6)
	}
	if n, ok := readUint(r, hw+"/power1_cap"); ok {
		p.LimitW = snapshot.Ptr(float64(n) / 1e6)
	}
	if n, ok := readUint(r, hw+"/power1_cap_max"); ok {
		p.MaxLimitW = snapshot.Ptr(float64(n) / 1e6)
	}
	if n, ok := readUint(r, hw+"/power1_cap_min"); ok {
		p.MinLimitW = snapshot.Ptr(float64(n) / 1e6)
	}
	if *p != (snapshot.Power{}) {
		g.Power = p
	}
	if n, ok := readUint(r, hw+"/fan1_input"); ok {
		g.Fans = append(g.Fans, snapshot.Fan{RPM: snapshot.Ptr(float64(n))})
	}
}

func readUint(r *reader, rel string) (uint64, bool) {
	v, ok := r.readString(rel)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}

func readMilli(r *reader, rel string) (float64, bool) {
	v, ok := r.readString(rel)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false
	}
	return float64(n) / 1000, true
}
