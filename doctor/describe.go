package doctor

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// gpuName names a GPU the way findings speak of it: "GPU 3 (0000:41:00.0)".
func gpuName(g *snapshot.GPU) string {
	switch {
	case g.PCIAddress != "":
		return fmt.Sprintf("GPU %d (%s)", g.Index, g.PCIAddress)
	case g.MatrixName != "":
		return g.MatrixName
	case g.UUID != "":
		return fmt.Sprintf("GPU %d (%s)", g.Index, g.UUID)
	}
	return fmt.Sprintf("GPU %d", g.Index)
}

// addrs returns the PCI addresses of GPUs that have one.
func addrs(gs []*snapshot.GPU) []string {
	var out []string
	for _, g := range gs {
		if g.PCIAddress != "" {
			out = append(out, g.PCIAddress)
		}
	}
	sort.Strings(out)
	return out
}

// gpus returns pointers to the snapshot's GPUs.
func gpus(s *snapshot.Snapshot) []*snapshot.GPU {
	out := make([]*snapshot.GPU, len(s.GPUs))
	for i := range s.GPUs {
		out[i] = &s.GPUs[i]
	}
	return out
}

// modelKey groups GPUs of one model: device id when known, else model name.
func modelKey(g *snapshot.GPU) string {
	if g.DeviceID != "" {
		return g.Vendor + ":" + g.DeviceID
	}
	return g.Vendor + ":" + strings.ToLower(strings.TrimSpace(g.Model))
}

// modelLabel is how a finding names a model group.
func modelLabel(g *snapshot.GPU) string {
	if g.Model != "" {
		return g.Model
	}
	return g.Vendor + " " + g.DeviceID
}

// throttleActive reports whether the named clock-event reason is active.
func throttleActive(g *snapshot.GPU, name string) bool {
	for _, t := range g.Throttle {
		if t.Name == name && t.Active {
			return true
		}
	}
	return false
}

// busy tells whether the GPU was working when read: true (busy), false
// (idle: the driver says so, or it sits in a low-power P-state), or unknown.
type activity int

const (
	activityUnknown activity = iota
	activityIdle
	activityBusy
)

func (a activity) String() string {
	return [...]string{"unknown", "idle", "busy"}[a]
}

func gpuActivity(g *snapshot.GPU) (activity, string) {
	if throttleActive(g, "idle") {
		return activityIdle, "clock event reason Idle is active"
	}
	if p := pstate(g); p >= 5 {
		return activityIdle, "performance state " + g.PerformanceState
	}
	if g.UtilizationGPU != nil {
		if *g.UtilizationGPU >= 10 {
			return activityBusy, fmt.Sprintf("utilization %.0f%%", *g.UtilizationGPU)
		}
		if *g.UtilizationGPU == 0 && pstate(g) < 0 {
			return activityIdle, "utilization 0%"
		}
	}
	if p := pstate(g); p >= 0 && p <= 2 {
		return activityBusy, "performance state " + g.PerformanceState
	}
	return activityUnknown, "no utilization or performance state read"
}

// pstate returns the P-state number, -1 if unknown. P5 and above are the
// reduced-clock states a GPU drops to without work (P8 the deepest).
func pstate(g *snapshot.GPU) int {
	var n int
	if _, err := fmt.Sscanf(g.PerformanceState, "P%d", &n); err != nil {
		return -1
	}
	return n
}

func pct(v float64) *float64 { return &v }

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func fmtFloat(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	return strings.TrimSuffix(s, ".0")
}
