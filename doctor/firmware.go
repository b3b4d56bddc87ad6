package doctor

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "firmware",
		IDs:  []string{"firmware-mismatch", "inforom-corrupted"},
		Doc:  "GPUs of one model run different VBIOS or firmware; InfoROM reported corrupted.",
		Run:  checkFirmware,
	})
}

func checkFirmware(in *Input) []Finding {
	var out []Finding
	groups := map[string][]*snapshot.GPU{}
	var keys []string
	for _, g := range gpus(in.Snapshot) {
		k := modelKey(g)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], g)
		if g.InfoROM != nil && g.InfoROM.Valid != nil && !*g.InfoROM.Valid {
			out = append(out, Finding{
				ID:        "inforom-corrupted",
				Severity:  Warning,
				Title:     fmt.Sprintf("%s: InfoROM failed validation", gpuName(g)),
				Devices:   addrs([]*snapshot.GPU{g}),
				Evidence:  []string{fmt.Sprintf("InfoROM image %q: checksum/validation failed", g.InfoROM.Image)},
				Impact:    "the GPU's InfoROM (ECC and page-retirement records, power settings) cannot be trusted: ECC history may be lost and the driver may refuse features",
				Remedy:    "Reflash the InfoROM with the vendor's tool through your server vendor's support; if it recurs, RMA the GPU.",
				Reference: "NVML nvmlDeviceValidateInforom",
			})
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		gs := groups[k]
		for _, fw := range firmwareFields(gs) {
			byVer := map[string][]*snapshot.GPU{}
			for _, g := range gs {
				if v := fw.get(g); v != "" {
					byVer[v] = append(byVer[v], g)
				}
			}
			if len(byVer) < 2 {
				continue
			}
			vers := make([]string, 0, len(byVer))
			for v := range byVer {
				vers = append(vers, v)
			}
			sort.Slice(vers, func(i, j int) bool {
				return len(byVer[vers[i]]) > len(byVer[vers[j]]) || (len(byVer[vers[i]]) == len(byVer[vers[j]]) && vers[i] < vers[j])
			})
			var ev []string
			var odd []*snapshot.GPU
			for i, v := range vers {
				var names []string
				for _, g := range byVer[v] {
					names = append(names, gpuName(g))
				}
				ev = append(ev, fmt.Sprintf("%s %s on %s", fw.name, v, strings.Join(names, ", ")))
				if i > 0 {
					odd = append(odd, byVer[v]...)
				}
			}
			out = append(out, Finding{
				ID:       "firmware-mismatch",
				Severity: Warning,
				Title:    fmt.Sprintf("%d %s GPUs run %d different %s versions", len(gs), modelLabel(gs[0]), len(vers), fw.name),
				Devices:  addrs(gs),
				Evidence: ev,
				Impact:   "identical cards with different firmware can differ in clocks, power limits, PCIe and NVLink behaviour and known bugs; jobs behave differently depending on which GPU they land on",
				Remedy:   fmt.Sprintf("Update the odd ones out (%s) to the version the rest run (%s), using your server vendor's firmware bundle for this board.", strings.Join(addrs(odd), ", "), vers[0]),
			})
		}
	}
	return out
}

type fwField struct {
	name string
	get  func(*snapshot.GPU) string
}

func firmwareFields(gs []*snapshot.GPU) []fwField {
	fields := []fwField{
		{"VBIOS", func(g *snapshot.GPU) string { return g.VBIOS }},
		{"InfoROM image", func(g *snapshot.GPU) string {
			if g.InfoROM == nil {
				return ""
			}
			return g.InfoROM.Image
		}},
	}
	names := map[string]bool{}
	for _, g := range gs {
		for n := range g.Firmware {
			names[n] = true
		}
	}
	var sorted []string
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		fields = append(fields, fwField{"firmware " + n, func(g *snapshot.GPU) string { return g.Firmware[n] }})
	}
	return fields
}
