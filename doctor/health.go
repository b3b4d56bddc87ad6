package doctor

import (
	"fmt"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "memory-errors",
		IDs:  []string{"ecc-uncorrectable", "ecc-correctable", "retired-pages-pending", "row-remap-pending", "row-remap-failure"},
		Doc:  "ECC error counters, page retirement and row remapping that need a reset or an RMA.",
		Run:  checkMemoryErrors,
	})
	register(Check{
		Name: "settings",
		IDs:  []string{"ecc-disabled", "persistence-off"},
		Doc:  "ECC turned off on a card that has it; persistence mode off on a Linux server.",
		Run:  checkSettings,
	})
}

// correctableWarn is the volatile correctable count from which kiln warns:
// a few corrected errors are normal on HBM; thousands since boot are not.
const correctableWarn = 1000

func u(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

func isTrue(p *bool) bool  { return p != nil && *p }
func isFalse(p *bool) bool { return p != nil && !*p }

func checkMemoryErrors(in *Input) []Finding {
	var out []Finding
	for _, g := range gpus(in.Snapshot) {
		dev := addrs([]*snapshot.GPU{g})
		if e := g.ECC; e != nil {
			vu, au := u(e.VolatileUncorrectable), u(e.AggregateUncorrectable)
			switch {
			case vu > 0:
				out = append(out, Finding{
					ID: "ecc-uncorrectable", Severity: Critical, Devices: dev,
					Title:     fmt.Sprintf("%s: %d uncorrectable ECC %s since the driver loaded", gpuName(g), vu, plural(int(vu), "error", "errors")),
					Evidence:  []string{fmt.Sprintf("volatile uncorrectable %d, aggregate uncorrectable %d", vu, au)},
					Impact:    "an uncorrectable error corrupts the data of the job that hit it (CUDA reports an ECC error and the job dies); the memory location must be retired or remapped",
					Remedy:    "Drain the GPU, reset it (nvidia-smi -r) or reboot so that the page is retired or the row remapped; RMA if errors return or remapping fails.",
					Reference: "NVIDIA GPU Memory Error Management (dynamic page retirement, row remapping)",
				})
			case au > 0:
				out = append(out, Finding{
					ID: "ecc-uncorrectable", Severity: Warning, Devices: dev,
					Title:    fmt.Sprintf("%s: %d uncorrectable ECC %s over the GPU's life", gpuName(g), au, plural(int(au), "error", "errors")),
					Evidence: []string{fmt.Sprintf("aggregate uncorrectable %d, none since the driver loaded", au)},
					Impact:   "past uncorrectable errors: the GPU has had memory failures; watch whether they recur",
					Remedy:   "Check that the affected pages were retired or rows remapped (no pending remap); keep the GPU under watch.",
				})
			}
			if vc := u(e.VolatileCorrectable); vc >= correctableWarn {
				out = append(out, Finding{
					ID: "ecc-correctable", Severity: Warning, Devices: dev,
					Title:    fmt.Sprintf("%s: %d correctable ECC errors since the driver loaded", gpuName(g), vc),
					Evidence: []string{fmt.Sprintf("volatile correctable %d (kiln warns from %d)", vc, correctableWarn)},
					Impact:   "correction costs little, but a high rate often precedes uncorrectable errors (Xid 92 reports excessive rates)",
					Remedy:   "Watch the rate; if it keeps rising, drain the GPU and have it checked.",
				})
			} else if vc > 0 {
				out = append(out, Finding{
					ID: "ecc-correctable", Severity: Info, Devices: dev,
					Title:    fmt.Sprintf("%s: %d correctable ECC %s since the driver loaded", gpuName(g), vc, plural(int(vc), "error", "errors")),
					Evidence: []string{fmt.Sprintf("volatile correctable %d", vc)},
					Impact:   "corrected transparently; worth watching",
					Remedy:   "None now; kiln warns from " + fmt.Sprint(correctableWarn) + ".",
				})
			}
		}
		if r := g.RetiredPages; r != nil && isTrue(r.Pending) {
			out = append(out, Finding{
				ID: "retired-pages-pending", Severity: Warning, Devices: dev,
				Title:    fmt.Sprintf("%s: retired memory pages wait for a GPU reset", gpuName(g)),
				Evidence: []string{fmt.Sprintf("pending retirement: yes; single-bit %d, double-bit %d", u(r.SingleBit), u(r.DoubleBit))},
				Impact:   "until the GPU is reset, the bad pages can still be handed to jobs",
				Remedy:   "Drain the GPU and reset it (nvidia-smi -r) or reboot the node.",
			})
		}
		if r := g.RemappedRows; r != nil {
			if isTrue(r.Failure) {
				out = append(out, Finding{
					ID: "row-remap-failure", Severity: Critical, Devices: dev,
					Title:     fmt.Sprintf("%s: row remapping failed", gpuName(g)),
					Evidence:  []string{fmt.Sprintf("remapping failure: yes; remapped rows correctable %d, uncorrectable %d", u(r.Correctable), u(r.Uncorrectable))},
					Impact:    "the GPU has run out of spare rows in a memory bank: further errors there cannot be repaired",
					Remedy:    "Drain the GPU and RMA it.",
					Reference: "NVIDIA GPU Memory Error Management: row remapping failure (Xid 64)",
				})
			}
			if isTrue(r.Pending) {
				out = append(out, Finding{
					ID: "row-remap-pending", Severity: Warning, Devices: dev,
					Title:    fmt.Sprintf("%s: a row remap waits for a GPU reset", gpuName(g)),
					Evidence: []string{fmt.Sprintf("pending remap: yes; remapped rows correctable %d, uncorrectable %d", u(r.Correctable), u(r.Uncorrectable))},
					Impact:   "the faulty row stays in use until the GPU is reset",
					Remedy:   "Drain the GPU and reset it (nvidia-smi -r) or reboot the node.",
				})
			}
		}
	}
	return out
}

func checkSettings(in *Input) []Finding {
	var out []Finding
	var eccOff, persOff []*snapshot.GPU
	for _, g := range gpus(in.Snapshot) {
		if g.ECC != nil && isFalse(g.ECC.Enabled) && !isFalse(g.ECC.Supported) && eccCapable(in, g) {
			eccOff = append(eccOff, g)
		}
		if isFalse(g.Persistence) && g.DriverModel != "WDDM" {
			persOff = append(persOff, g)
		}
	}
	if len(eccOff) > 0 {
		out = append(out, Finding{
			ID: "ecc-disabled", Severity: Info, Devices: addrs(eccOff),
			Title:    fmt.Sprintf("ECC is off on %d %s that support it", len(eccOff), plural(len(eccOff), "GPU", "GPUs")),
			Evidence: gpuList(eccOff, "ECC mode Disabled"),
			Impact:   "memory errors go undetected and silently corrupt results; with ECC on, usable memory shrinks by a few percent on GDDR cards",
			Remedy:   "Enable ECC (nvidia-smi -e 1, then reset the GPU or reboot) on machines whose results must be trusted.",
		})
	}
	if len(persOff) > 0 {
		out = append(out, Finding{
			ID: "persistence-off", Severity: Info, Devices: addrs(persOff),
			Title:     fmt.Sprintf("persistence mode is off on %d %s", len(persOff), plural(len(persOff), "GPU", "GPUs")),
			Evidence:  gpuList(persOff, "Persistence Mode Disabled"),
			Impact:    "the driver tears the GPU state down when the last process exits: every job start pays the initialisation again (seconds on large GPUs) and some settings reset",
			Remedy:    "Run nvidia-persistenced (systemctl enable --now nvidia-persistenced).",
			Reference: "NVIDIA Driver Persistence documentation",
		})
	}
	return out
}

// eccCapable says whether a GPU has ECC: the catalog decides, else the
// presence of a pending mode or counters shows the driver supports it.
func eccCapable(in *Input, g *snapshot.GPU) bool {
	if m, ok := in.KB.GPUByDeviceID(g.Vendor, g.DeviceID); ok {
		return m.ECC
	}
	if m, ok := in.KB.GPUByName(g.Model); ok {
		return m.ECC
	}
	return g.ECC.Pending != nil || g.ECC.VolatileCorrectable != nil
}

func gpuList(gs []*snapshot.GPU, what string) []string {
	var out []string
	for _, g := range gs {
		out = append(out, gpuName(g)+": "+what)
	}
	return out
}
