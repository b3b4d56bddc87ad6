package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "mig",
		IDs:  []string{"mig-pending", "mig-stranded"},
		Doc:  "MIG mode changes waiting for a GPU reset; compute slices left unusable by the memory slices taken.",
		Run:  checkMIG,
	})
}

func checkMIG(in *Input) []Finding {
	var out []Finding
	for _, g := range gpus(in.Snapshot) {
		m := g.MIG
		if m == nil {
			continue
		}
		dev := addrs([]*snapshot.GPU{g})
		if m.PendingEnabled != nil && *m.PendingEnabled != m.Enabled {
			out = append(out, Finding{
				ID: "mig-pending", Severity: Warning, Devices: dev,
				Title:    fmt.Sprintf("%s: MIG mode change to %s waits for a GPU reset", gpuName(g), onOff(*m.PendingEnabled)),
				Evidence: []string{fmt.Sprintf("MIG mode current %s, pending %s", onOff(m.Enabled), onOff(*m.PendingEnabled))},
				Impact:   "the GPU keeps its old mode until it is reset: jobs expecting MIG slices (or the whole GPU) do not get them",
				Remedy:   "Drain the GPU and reset it (nvidia-smi -r -i N) or reboot the node.",
			})
		}
		if !m.Enabled || len(m.Instances) == 0 {
			continue
		}
		geo, ok := in.KB.MIGProfiles(g.Model)
		if !ok {
			continue
		}
		var insts []kb.MIGInstance
		seenGI := map[int]bool{}
		for _, i := range m.Instances {
			// Several compute instances of one GPU instance share its slices.
			if seenGI[i.GPUInstance] {
				continue
			}
			seenGI[i.GPUInstance] = true
			insts = append(insts, kb.MIGInstance{Profile: i.Profile, SMs: i.SMs, MemoryMiB: float64(i.MemoryBytes) / (1 << 20)})
		}
		use, err := geo.Usage(insts)
		if err != nil || use.ComputeSlicesStranded == 0 {
			continue
		}
		out = append(out, Finding{
			ID: "mig-stranded", Severity: Info, Devices: dev,
			Title: fmt.Sprintf("%s: %d of %d MIG compute slices cannot be used: no memory slice is left", gpuName(g), use.ComputeSlicesStranded, use.ComputeSlicesTotal),
			Evidence: []string{
				fmt.Sprintf("%d MIG instances: %s", len(insts), strings.Join(use.Profiles, ", ")),
				fmt.Sprintf("memory slices used %d of %d; compute slices used %d of %d", use.MemorySlicesUsed, use.MemorySlicesTotal, use.ComputeSlicesUsed, use.ComputeSlicesTotal),
			},
			Impact:        fmt.Sprintf("%d compute slices (%s%% of the GPU's compute) sit idle until the layout changes", use.ComputeSlicesStranded, fmtFloat(100*float64(use.ComputeSlicesStranded)/float64(use.ComputeSlicesTotal))),
			ImpactPercent: pct(100 * float64(use.ComputeSlicesStranded) / float64(use.ComputeSlicesTotal)),
			Remedy:        "Use profiles whose memory-to-compute ratio matches the GPU (for example 1g.10gb instead of 1g.20gb on an 80 GB A100), or give the spare compute to one instance with more slices.",
			Reference:     "NVIDIA MIG User Guide: supported profiles and placements",
		})
	}
	return out
}

func onOff(b bool) string {
	if b {
		return "Enabled"
	}
	return "Disabled"
}
