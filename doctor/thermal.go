package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "clocks",
		IDs:  []string{"throttle-thermal", "throttle-power", "hw-slowdown", "power-limit-reduced"},
		Doc:  "Clock-event reasons that slow a GPU (thermal, power cap, hardware slowdown and power brake) and lowered power limits.",
		Run:  checkClocks,
	})
	register(Check{
		Name: "cooling",
		IDs:  []string{"temperature-high", "fan-failure"},
		Doc:  "GPU, memory or junction temperature near the slowdown point; fans that report a fault.",
		Run:  checkCooling,
	})
}

const refClockEvents = "NVML nvmlClocksEventReasons (nvidia-smi -q -d PERFORMANCE)"

func checkClocks(in *Input) []Finding {
	var out []Finding
	for _, g := range gpus(in.Snapshot) {
		dev := addrs([]*snapshot.GPU{g})
		act, why := gpuActivity(g)
		power := powerText(g)
		temp := tempText(g)
		if throttleActive(g, "hw_thermal_slowdown") || throttleActive(g, "sw_thermal_slowdown") {
			var names []string
			for _, n := range []string{"hw_thermal_slowdown", "sw_thermal_slowdown"} {
				if throttleActive(g, n) {
					names = append(names, n)
				}
			}
			out = append(out, Finding{
				ID: "throttle-thermal", Severity: Warning, Devices: dev,
				Title:     fmt.Sprintf("%s: clocks lowered for temperature (%s)", gpuName(g), strings.Join(names, ", ")),
				Evidence:  []string{"active clock event reasons: " + strings.Join(names, ", "), temp},
				Impact:    "the GPU runs below its rated clocks while the reason is active; a thermal slowdown at a low reported temperature points at a hot spot (memory, VRM) or a sensor fault",
				Remedy:    "Check airflow, fan and cooling-loop health, inlet temperature and dust; compare with the GPU's neighbours.",
				Reference: refClockEvents,
			})
		}
		if throttleActive(g, "sw_power_cap") {
			sev := Warning
			impact := "the driver holds clocks down to stay under the power limit while the GPU works"
			if act == activityIdle {
				sev = Info
				impact = "the GPU is idle (" + why + "); a power cap at idle costs nothing now, but shows the limit is reached in this state"
			}
			out = append(out, Finding{
				ID: "throttle-power", Severity: sev, Devices: dev,
				Title:     fmt.Sprintf("%s: software power cap active", gpuName(g)),
				Evidence:  append([]string{"clock event reason sw_power_cap: Active" + counter(g, "sw_power_cap"), power}, "activity: "+act.String()+" ("+why+")"),
				Impact:    impact,
				Remedy:    "Compare the power limit with the board's default (nvidia-smi -q -d POWER); raise it if it was lowered, and check PSU capacity and power-capping policies (data-centre power management, BMC).",
				Reference: refClockEvents,
			})
		}
		if throttleActive(g, "hw_slowdown") || throttleActive(g, "hw_power_brake_slowdown") {
			var names []string
			for _, n := range []string{"hw_slowdown", "hw_power_brake_slowdown"} {
				if throttleActive(g, n) {
					names = append(names, n)
				}
			}
			out = append(out, Finding{
				ID: "hw-slowdown", Severity: Warning, Devices: dev,
				Title:     fmt.Sprintf("%s: hardware slowdown active (%s)", gpuName(g), strings.Join(names, ", ")),
				Evidence:  []string{"active clock event reasons: " + strings.Join(names, ", "), power, temp},
				Impact:    "hardware cut the clocks by half or more: HW Power Brake is asserted by the board or system (power supply or external signal), HW Slowdown by over-temperature or over-current",
				Remedy:    "Check the power supplies and their redundancy, the chassis power-brake signal (BMC event log) and cooling; a GPU that keeps asserting it alone needs service.",
				Reference: refClockEvents,
			})
		}
		if p := g.Power; p != nil && p.LimitW != nil && p.DefaultLimitW != nil && *p.LimitW < 0.95**p.DefaultLimitW {
			lost := 100 * (1 - *p.LimitW / *p.DefaultLimitW)
			out = append(out, Finding{
				ID: "power-limit-reduced", Severity: Warning, Devices: dev,
				Title:         fmt.Sprintf("%s: power limit %s W is below the default %s W", gpuName(g), fmtFloat(*p.LimitW), fmtFloat(*p.DefaultLimitW)),
				Evidence:      []string{power},
				Impact:        fmt.Sprintf("the GPU may draw %s%% less power than it is built for; power-bound work (training) slows accordingly", fmtFloat(lost)),
				ImpactPercent: pct(lost),
				Remedy:        "Restore the default limit (nvidia-smi -pl DEFAULT_W) unless it was lowered on purpose for the rack's power budget.",
			})
		}
	}
	return out
}

func counter(g *snapshot.GPU, name string) string {
	for _, t := range g.Throttle {
		if t.Name == name && t.Microseconds != nil {
			return fmt.Sprintf(" (%.1f h accumulated)", float64(*t.Microseconds)/3.6e9)
		}
	}
	return ""
}

func powerText(g *snapshot.GPU) string {
	p := g.Power
	if p == nil || p.DrawW == nil {
		return "power draw not read"
	}
	s := fmt.Sprintf("power draw %s W", fmtFloat(*p.DrawW))
	if p.LimitW != nil {
		s += fmt.Sprintf(" of %s W limit", fmtFloat(*p.LimitW))
	}
	if p.DefaultLimitW != nil {
		s += fmt.Sprintf(" (default %s W)", fmtFloat(*p.DefaultLimitW))
	}
	return s
}

func tempText(g *snapshot.GPU) string {
	t := g.Temperature
	if t == nil {
		return "temperature not read"
	}
	s := ""
	add := func(name string, v *float64) {
		if v != nil {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%s %s C", name, fmtFloat(*v))
		}
	}
	add("GPU", t.GPUC)
	add("edge", t.EdgeC)
	add("junction", t.JunctionC)
	add("memory", t.MemoryC)
	add("slowdown at", t.SlowdownC)
	if s == "" {
		return "temperature not read"
	}
	return s
}

func checkCooling(in *Input) []Finding {
	var out []Finding
	var fanBad []*snapshot.GPU
	var fanEv []string
	down := unreachable(in.Snapshot)
	for _, g := range gpus(in.Snapshot) {
		for i, f := range g.Fans {
			// A GPU the driver cannot read reads ERR! everywhere: its fan
			// is not the fault (gpu-unreachable says what is).
			if f.Error != "" && !down[g.PCIAddress] {
				fanBad = append(fanBad, g)
				fanEv = append(fanEv, fmt.Sprintf("%s fan %d reads %q", gpuName(g), i, f.Error))
				break
			}
		}
		if f, ok := hotFinding(g); ok {
			out = append(out, f)
		}
	}
	if len(fanBad) > 0 {
		out = append(out, Finding{
			ID: "fan-failure", Severity: Warning, Devices: addrs(fanBad),
			Title:    fmt.Sprintf("%d %s a fan fault", len(fanBad), plural(len(fanBad), "GPU reports", "GPUs report")),
			Evidence: fanEv,
			Impact:   "a failed fan or tachometer lets the GPU overheat and throttle, or hides that it does",
			Remedy:   "Check the fan and its cable; replace the fan or the card's cooler.",
		})
	}
	return out
}

// hotFinding compares temperatures with the driver's own thresholds where
// given, else with fixed margins: GPU core 85 C, HBM 90 C (5 C under the
// 95 C that HBM parts are run to, the margin kept under a threshold the
// driver gives), AMD junction 100 C.
func hotFinding(g *snapshot.GPU) (Finding, bool) {
	t := g.Temperature
	if t == nil {
		return Finding{}, false
	}
	type probe struct {
		name  string
		v     *float64
		limit float64
		crit  float64
	}
	lim := func(th *float64, margin, def float64) float64 {
		if th != nil && *th > 0 {
			return *th - margin
		}
		return def
	}
	probes := []probe{
		{"GPU", t.GPUC, lim(t.SlowdownC, 5, 85), lim(t.ShutdownC, 5, 95)},
		{"memory", t.MemoryC, lim(t.MemMaxC, 5, 90), lim(t.MemMaxC, 0, 105)},
		{"junction", t.JunctionC, lim(t.CriticalC, 10, 100), lim(t.CriticalC, 2, 110)},
		{"edge", t.EdgeC, lim(t.CriticalC, 10, 90), lim(t.CriticalC, 2, 100)},
	}
	for _, p := range probes {
		if p.v == nil || *p.v < p.limit {
			continue
		}
		sev := Warning
		if *p.v >= p.crit {
			sev = Critical
		}
		return Finding{
			ID: "temperature-high", Severity: sev, Devices: addrs([]*snapshot.GPU{g}),
			Title:    fmt.Sprintf("%s: %s temperature %s C is near its limit", gpuName(g), p.name, fmtFloat(*p.v)),
			Evidence: []string{tempText(g), fmt.Sprintf("kiln warns from %s C for %s", fmtFloat(p.limit), p.name)},
			Impact:   "the GPU will lower clocks to protect itself, and at the shutdown threshold stop",
			Remedy:   "Check airflow, fans, blanking panels and inlet temperature; lower the load on this GPU until cooling is fixed.",
		}, true
	}
	return Finding{}, false
}
