package doctor

import (
	"fmt"
	"sort"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "reach",
		IDs:  []string{"gpu-unreachable"},
		Doc:  "A GPU tool that failed on a GPU or on the driver (nvidia-smi's \"Unable to determine the device handle\", \"No devices were found\", \"couldn't communicate with the NVIDIA driver\", rows of ERR!, rocm-smi read errors): the GPU or its driver is down.",
		Run:  checkReach,
	})
}

// toolErrors returns the tool-error events of the given reasons (all when
// none is given).
func toolErrors(s *snapshot.Snapshot, reasons ...string) []snapshot.Event {
	var out []snapshot.Event
	for _, e := range s.Events {
		if e.Kind != snapshot.EventToolError {
			continue
		}
		if len(reasons) == 0 {
			out = append(out, e)
			continue
		}
		for _, r := range reasons {
			if e.Reason == r {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// unreachable lists the GPUs a tool or the driver could not read.
func unreachable(s *snapshot.Snapshot) map[string]bool {
	out := map[string]bool{}
	for _, e := range s.Events {
		if e.Device != "" && (e.Kind == snapshot.EventToolError || e.Kind == snapshot.EventInitFailed) {
			out[e.Device] = true
		}
	}
	return out
}

// checkReach reports what failed tools say. A lost GPU is reported with
// the fallen-off-bus events (checkEvents) and a version mismatch with the
// driver check, so that each fault is one finding.
func checkReach(in *Input) []Finding {
	byDev := map[string][]snapshot.Event{}
	var node []snapshot.Event
	evs := toolErrors(in.Snapshot, snapshot.ToolGPUError, snapshot.ToolDriverUnreachable, snapshot.ToolNoDevices)
	for _, e := range in.Snapshot.Events {
		if e.Kind == snapshot.EventInitFailed {
			evs = append(evs, e)
		}
	}
	for _, e := range evs {
		if e.Device == "" {
			node = append(node, e)
			continue
		}
		byDev[e.Device] = append(byDev[e.Device], e)
	}
	var out []Finding
	devs := make([]string, 0, len(byDev))
	for d := range byDev {
		devs = append(devs, d)
	}
	sort.Strings(devs)
	for _, d := range devs {
		evs := byDev[d]
		title := fmt.Sprintf("%s: the driver cannot read this GPU (%s said so)", d, evs[0].Source)
		if evs[0].Kind == snapshot.EventInitFailed {
			title = fmt.Sprintf("%s: the driver could not bring this GPU up (%s)", d, countSpan(evs))
		}
		out = append(out, Finding{
			ID: "gpu-unreachable", Severity: Critical, Devices: []string{d},
			Title:    title,
			Evidence: eventLines(evs, 3),
			Impact:   "the GPU does not answer the driver: jobs on it fail or hang, and it cannot be leased",
			Remedy:   "Read the kernel log for an Xid around this time (79, 119, 62, 48 name the cause). Drain the GPU, reset it (nvidia-smi -r -i " + d + ") or reboot the node; reseat or RMA a GPU that does not come back.",
		})
	}
	if len(node) > 0 {
		f := Finding{
			ID: "gpu-unreachable", Severity: Critical, Devices: addrs(nvidiaGPUs(in.Snapshot)),
			Evidence: eventLines(node, 3),
			Impact:   "no GPU of this node can be used: the tool cannot reach the driver or finds no GPU",
		}
		switch {
		case node[0].Kind == snapshot.EventInitFailed:
			f.Title = "the driver could not bring a GPU up (" + countSpan(node) + ")"
			f.Remedy = "Read the lines around it: RmInitAdapter's codes and GSP or firmware boot errors name the cause. Reset the GPU or power-cycle the node; update the driver and VBIOS; reseat or RMA a GPU that fails again."
		case node[0].Reason == snapshot.ToolNoDevices:
			f.Title = "the GPU tool found no GPU on this node"
			f.Remedy = "Check that the GPUs are on the PCI bus (lspci -d 10de: / -d 1002:) and bound to the driver (lspci -k): a GPU on the bus that the driver did not take points to a failed probe (kernel log: NVRM RmInitAdapter, Xid 79), one missing from the bus to power, slot or riser. In a container, check that the GPU devices were passed in."
		default:
			f.Title = "the GPU tool cannot talk to the driver"
			f.Remedy = "Check that the kernel module is loaded (lsmod | grep nvidia; the kernel log says why a load failed: a kernel updated without rebuilding the module, Secure Boot, nouveau). Reinstall or rebuild the driver for the running kernel and reboot."
		}
		out = append(out, f)
	}
	return out
}
