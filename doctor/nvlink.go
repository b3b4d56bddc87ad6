package doctor

import (
	"fmt"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "nvlink",
		IDs:  []string{"nvlink-inactive"},
		Doc:  "Fewer active NVLinks than the GPU model has, or than its peers have.",
		Run:  checkNVLink,
	})
}

func checkNVLink(in *Input) []Finding {
	gs := gpus(in.Snapshot)
	peerMax := 0
	active := map[*snapshot.GPU]int{}
	for _, g := range gs {
		if len(g.NVLinks) == 0 {
			continue
		}
		n := 0
		for _, l := range g.NVLinks {
			if l.State == "active" {
				n++
			}
		}
		active[g] = n
		peerMax = max(peerMax, n)
	}
	var out []Finding
	for _, g := range gs {
		n, ok := active[g]
		if !ok {
			continue
		}
		want, basis := peerMax, "its peers have"
		if m, ok := in.KB.GPUByDeviceID(g.Vendor, g.DeviceID); ok && m.Interconnect == "nvlink" && m.InterconnectLinks > 0 && len(g.NVLinks) >= m.InterconnectLinks {
			want, basis = m.InterconnectLinks, fmt.Sprintf("a %s has", m.Name)
		}
		if n >= want {
			continue
		}
		var down []int
		for _, l := range g.NVLinks {
			if l.State != "active" {
				down = append(down, l.Link)
			}
		}
		lost := 100 * float64(want-n) / float64(want)
		sev := Warning
		if n == 0 {
			sev = Critical
		}
		out = append(out, Finding{
			ID: "nvlink-inactive", Severity: sev, Devices: addrs([]*snapshot.GPU{g}),
			Title:         fmt.Sprintf("%s: %d of %d NVLinks active", gpuName(g), n, want),
			Evidence:      []string{fmt.Sprintf("inactive links: %v", down), fmt.Sprintf("%d active links expected: %s", want, basis)},
			Impact:        fmt.Sprintf("GPU-to-GPU bandwidth of this GPU is %s%% lower; collectives across the node run at the pace of the slowest GPU", fmtFloat(lost)),
			ImpactPercent: pct(lost),
			Remedy:        "Reset the GPU (or reboot); if links stay down, check the NVLink bridge or baseboard, the fabric manager log, and open a support case.",
		})
	}
	return out
}
