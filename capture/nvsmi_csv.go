package capture

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// `nvidia-smi --query-gpu=name,pci.bus_id,... --format=csv` (with or without
// noheader and nounits): the form scripts, exporters and cron jobs record.
// A header names the fields ("pci.bus_id", "memory.total [MiB]"); without
// one the fields are unknown and the file is not read. Values go through the
// same readers as nvidia-smi -q's, so "[N/A]", "[Not Supported]" and units
// mean the same here.
func init() {
	RegisterFile(FileImporter{Kind: "nvidia-smi-csv", Detect: detectNvsmiCSV, Parse: parseNvsmiCSV})
}

// csvField maps a query field (without its unit) to where nvRaw keeps it.
var csvFields = map[string]func(r *nvRaw, v nvVal){
	"name":                                   func(r *nvRaw, v nvVal) { r.product = v },
	"gpu_name":                               func(r *nvRaw, v nvVal) { r.product = v },
	"pci.bus_id":                             func(r *nvRaw, v nvVal) { r.busID = v },
	"gpu_bus_id":                             func(r *nvRaw, v nvVal) { r.busID = v },
	"uuid":                                   func(r *nvRaw, v nvVal) { r.uuid = v },
	"gpu_uuid":                               func(r *nvRaw, v nvVal) { r.uuid = v },
	"serial":                                 func(r *nvRaw, v nvVal) { r.serial = v },
	"gpu_serial":                             func(r *nvRaw, v nvVal) { r.serial = v },
	"vbios_version":                          func(r *nvRaw, v nvVal) { r.vbios = v },
	"persistence_mode":                       func(r *nvRaw, v nvVal) { r.persistence = v },
	"compute_mode":                           func(r *nvRaw, v nvVal) { r.computeMode = v },
	"driver_model.current":                   func(r *nvRaw, v nvVal) { r.driverModel = v },
	"pstate":                                 func(r *nvRaw, v nvVal) { r.pstate = v },
	"utilization.gpu":                        func(r *nvRaw, v nvVal) { r.utilGPU = v },
	"memory.total":                           func(r *nvRaw, v nvVal) { r.fbTotal = v },
	"memory.used":                            func(r *nvRaw, v nvVal) { r.fbUsed = v },
	"power.draw":                             func(r *nvRaw, v nvVal) { r.powerDraw = v },
	"power.draw.instant":                     func(r *nvRaw, v nvVal) { r.powerDraw = v },
	"power.limit":                            func(r *nvRaw, v nvVal) { r.powerLimit = v },
	"enforced.power.limit":                   func(r *nvRaw, v nvVal) { r.powerEnforced = v },
	"power.default_limit":                    func(r *nvRaw, v nvVal) { r.powerDefault = v },
	"power.min_limit":                        func(r *nvRaw, v nvVal) { r.powerMin = v },
	"power.max_limit":                        func(r *nvRaw, v nvVal) { r.powerMax = v },
	"clocks.gr":                              func(r *nvRaw, v nvVal) { r.clkGraphics = v },
	"clocks.current.graphics":                func(r *nvRaw, v nvVal) { r.clkGraphics = v },
	"clocks.sm":                              func(r *nvRaw, v nvVal) { r.clkSM = v },
	"clocks.current.sm":                      func(r *nvRaw, v nvVal) { r.clkSM = v },
	"clocks.mem":                             func(r *nvRaw, v nvVal) { r.clkMem = v },
	"clocks.current.memory":                  func(r *nvRaw, v nvVal) { r.clkMem = v },
	"clocks.max.gr":                          func(r *nvRaw, v nvVal) { r.maxGraphics = v },
	"clocks.max.graphics":                    func(r *nvRaw, v nvVal) { r.maxGraphics = v },
	"clocks.max.sm":                          func(r *nvRaw, v nvVal) { r.maxSM = v },
	"clocks.max.mem":                         func(r *nvRaw, v nvVal) { r.maxMem = v },
	"clocks.max.memory":                      func(r *nvRaw, v nvVal) { r.maxMem = v },
	"temperature.gpu":                        func(r *nvRaw, v nvVal) { r.tempGPU = v },
	"temperature.memory":                     func(r *nvRaw, v nvVal) { r.tempMem = v },
	"fan.speed":                              func(r *nvRaw, v nvVal) { r.fans = append(r.fans, v) },
	"pcie.link.gen.current":                  func(r *nvRaw, v nvVal) { r.genCur = v },
	"pcie.link.gen.gpucurrent":               func(r *nvRaw, v nvVal) { r.genDevCur = v },
	"pcie.link.gen.max":                      func(r *nvRaw, v nvVal) { r.genMax = v },
	"pcie.link.gen.gpumax":                   func(r *nvRaw, v nvVal) { r.genDevMax = v },
	"pcie.link.gen.hostmax":                  func(r *nvRaw, v nvVal) { r.genHostMax = v },
	"pcie.link.width.current":                func(r *nvRaw, v nvVal) { r.widthCur = v },
	"pcie.link.width.max":                    func(r *nvRaw, v nvVal) { r.widthMax = v },
	"mig.mode.current":                       func(r *nvRaw, v nvVal) { r.migCurrent = v },
	"mig.mode.pending":                       func(r *nvRaw, v nvVal) { r.migPending = v },
	"ecc.mode.current":                       func(r *nvRaw, v nvVal) { r.eccSeen, r.eccCurrent = true, v },
	"ecc.mode.pending":                       func(r *nvRaw, v nvVal) { r.eccSeen, r.eccPending = true, v },
	"ecc.errors.corrected.volatile.total":    func(r *nvRaw, v nvVal) { r.eccSeen, r.eccVolCorr = true, append(r.eccVolCorr, v) },
	"ecc.errors.uncorrected.volatile.total":  func(r *nvRaw, v nvVal) { r.eccSeen, r.eccVolUnc = true, append(r.eccVolUnc, v) },
	"ecc.errors.corrected.aggregate.total":   func(r *nvRaw, v nvVal) { r.eccSeen, r.eccAggCorr = true, append(r.eccAggCorr, v) },
	"ecc.errors.uncorrected.aggregate.total": func(r *nvRaw, v nvVal) { r.eccSeen, r.eccAggUnc = true, append(r.eccAggUnc, v) },
	"retired_pages.sbe":                      func(r *nvRaw, v nvVal) { r.retiredSBE = v },
	"retired_pages.single_bit_ecc.count":     func(r *nvRaw, v nvVal) { r.retiredSBE = v },
	"retired_pages.dbe":                      func(r *nvRaw, v nvVal) { r.retiredDBE = v },
	"retired_pages.double_bit.count":         func(r *nvRaw, v nvVal) { r.retiredDBE = v },
	"retired_pages.pending":                  func(r *nvRaw, v nvVal) { r.retiredPending = v },
	"remapped_rows.correctable":              func(r *nvRaw, v nvVal) { r.remapCorr = v },
	"remapped_rows.uncorrectable":            func(r *nvRaw, v nvVal) { r.remapUnc = v },
	"remapped_rows.pending":                  func(r *nvRaw, v nvVal) { r.remapPending = v },
	"remapped_rows.failure":                  func(r *nvRaw, v nvVal) { r.remapFailure = v },
	"pcie.replay_counter":                    func(r *nvRaw, v nvVal) { r.replays = v },
}

// csvFieldName is a header cell without its unit ("memory.total [MiB]"),
// lower case.
func csvFieldName(h string) string {
	h = strings.TrimSpace(h)
	if i := strings.Index(h, " ["); i >= 0 {
		h = h[:i]
	}
	return strings.ToLower(h)
}

// csvKnown: a field kiln reads, a clock-event reason, or one of the other
// query fields (index, timestamp, driver_version, ...).
func csvKnown(f string) bool {
	if _, ok := csvFields[f]; ok {
		return true
	}
	for _, p := range []string{"clocks_throttle_reasons.", "clocks_event_reasons.", "clocks.", "power.", "memory.", "temperature.",
		"pci.", "pcie.", "ecc.", "utilization.", "encoder.", "mig.", "inforom.", "retired_pages.", "remapped_rows.", "fabric.", "driver_model."} {
		if strings.HasPrefix(f, p) {
			return true
		}
	}
	switch f {
	case "index", "timestamp", "driver_version", "count", "display_mode", "display_active", "accounting.mode", "gom.current",
		"vbios_version", "board_id", "vgpu_driver_capability.heterogenous_multivgpu", "addressing_mode", "protected_memory.total":
		return true
	}
	return false
}

func detectNvsmiCSV(_ string, data []byte) bool {
	// The header: the first line that is neither blank nor a failed
	// device's message.
	line := ""
	forEachLine(data, func(l []byte) bool {
		t := bytes.TrimSpace(l)
		if len(t) == 0 || (mayHoldToolError(t) && len(scanToolErrors(t, "")) > 0) {
			return true
		}
		line = string(t)
		return false
	})
	cells := strings.Split(line, ",")
	if len(cells) < 2 {
		return false
	}
	known, id := 0, false
	for _, c := range cells {
		f := csvFieldName(c)
		if csvKnown(f) {
			known++
		}
		if f == "pci.bus_id" || f == "uuid" || f == "name" || f == "index" || f == "gpu_bus_id" {
			id = true
		}
	}
	return id && known*4 >= len(cells)*3
}

// csvRowError: a row whose values say the GPU is lost or needs a reset, or
// that is mostly "[Unknown Error]", is a GPU the driver cannot read.
func csvRowError(rec []string, addr string) (snapshot.Event, bool) {
	reason, unknown := "", 0
	for _, v := range rec {
		l := strings.ToLower(v)
		switch {
		case strings.Contains(l, "gpu is lost"):
			reason = snapshot.ToolGPULost
		case strings.Contains(l, "requires reset") && reason == "":
			reason = snapshot.ToolGPUError
		case strings.Contains(l, "unknown error"):
			unknown++
		}
	}
	if reason == "" && (unknown < 2 || unknown*2 < len(rec)) {
		return snapshot.Event{}, false
	}
	if reason == "" {
		reason = snapshot.ToolGPUError
	}
	return snapshot.Event{Source: "nvidia-smi-csv", Kind: snapshot.EventToolError, Reason: reason, Device: addr,
		Message: "nvidia-smi --query-gpu: " + strings.Join(rec, ",")}, true
}

// csvBody is the CSV without the lines nvidia-smi prints about GPUs it could
// not reach ("Unable to determine the device handle for GPU ...", before
// the header or between rows) and without blank lines; those are read as
// tool errors from the whole file.
func csvBody(data []byte) []byte {
	if !mayHoldToolError(data) && !bytes.Contains(data, []byte("\n\n")) {
		return data
	}
	var out []byte
	forEachLine(data, func(line []byte) bool {
		if len(bytes.TrimSpace(line)) == 0 || len(scanToolErrors(line, "")) > 0 {
			return true
		}
		out = append(append(out, line...), '\n')
		return true
	})
	return out
}

func parseNvsmiCSV(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{}
	notes := &nvsmiNotes{source: "nvidia-smi-csv"}
	rd := csv.NewReader(bytes.NewReader(csvBody(data)))
	rd.TrimLeadingSpace = true
	rd.FieldsPerRecord = -1
	rd.LazyQuotes = true
	header, err := rd.Read()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi csv: %w", err)
	}
	fields := make([]string, len(header))
	for i, h := range header {
		fields[i] = csvFieldName(h)
	}
	seen := map[string]int{}
	var driver, ts nvVal
	line := 1
	for {
		rec, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line++
		if err != nil {
			notes.add("line %d: %v", line, err)
			continue
		}
		if len(rec) != len(fields) {
			// A header repeated by a loop (-l), a cut last line, a message
			// (read below as a tool error).
			if len(rec) > 0 && strings.TrimSpace(rec[0]) != header[0] && len(scanToolErrors([]byte(strings.Join(rec, ",")), "")) == 0 {
				notes.add("line %d has %d fields, the header names %d: not read", line, len(rec), len(fields))
			}
			continue
		}
		r := &nvRaw{}
		for i, f := range fields {
			v := nvVal{s: strings.TrimSpace(rec[i]), at: fmt.Sprintf("line %d (%s)", line, header[i])}
			switch {
			case f == "driver_version":
				driver = v
			case f == "timestamp":
				ts = v
			case strings.HasPrefix(f, "clocks_throttle_reasons.") || strings.HasPrefix(f, "clocks_event_reasons."):
				reason := f[strings.IndexByte(f, '.')+1:]
				if reason != "active" && reason != "supported" {
					r.reasons = append(r.reasons, nvReason{label: reason, value: v})
				}
			default:
				if set, ok := csvFields[f]; ok {
					set(r, v)
				}
			}
		}
		g, err := r.build(len(s.GPUs), notes)
		if err != nil {
			notes.add("line %d: %v", line, err)
			continue
		}
		if ev, ok := csvRowError(rec, g.PCIAddress); ok {
			s.Events = append(s.Events, ev)
		}
		key := g.PCIAddress
		if key == "" {
			key = g.UUID
		}
		if i, dup := seen[key]; dup && key != "" {
			// A log of repeated queries (-l): the last row of a GPU wins.
			g.Index = i
			s.GPUs[i] = g
			continue
		}
		seen[key] = len(s.GPUs)
		s.GPUs = append(s.GPUs, g)
	}
	if len(s.GPUs) == 0 {
		return nil, errors.New("nvidia-smi csv: no GPU row")
	}
	s.Drivers.NVIDIAUser = nvsmiText(driver)
	if t, ok := nvsmiTime(ts.s); ok {
		s.CollectedAt = t
	}
	s.Events = append(s.Events, scanToolErrors(data, "nvidia-smi-csv")...)
	s.Notes = append(s.Notes, notes.notes...)
	return s, nil
}
