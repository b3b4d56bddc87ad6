package capture

import (
	"kiln.dev/kiln/kb"

	"strconv"
	"strings"
)

// pcieGenFromGTps maps a PCIe transfer rate as tools print it ("32GT/s",
// "2.5GT/s", "16.0 GT/s PCIe", "8") to its generation 1-6. It returns 0 for
// a rate it does not know ("unknown", "128GT/s"): an unknown rate stays
// unknown.
func pcieGenFromGTps(s string) int {
	s = strings.TrimSpace(s)
	end := 0
	for end < len(s) && (s[end] == '.' || (s[end] >= '0' && s[end] <= '9')) {
		end++
	}
	if end == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0
	}
	return kb.Default().PCIeGenForGTps(v)
}

// lnkSpeedWidth reads the speed and width of an lspci LnkCap or LnkSta
// value ("Port #0, Speed 32GT/s, Width x16, ASPM L1" or
// "Speed 16GT/s (downgraded), Width x4 (ok)"). A field that is missing or
// unreadable is returned as 0. "(downgraded)" is only lspci's comparison
// with the capability and is not kept.
func lnkSpeedWidth(v string) (gen, width int) {
	for len(v) > 0 {
		var field string
		field, v, _ = strings.Cut(v, ",")
		field = strings.TrimSpace(field)
		switch {
		case strings.HasPrefix(field, "Speed "):
			gen = pcieGenFromGTps(field[len("Speed "):])
		case strings.HasPrefix(field, "Width x"):
			w := field[len("Width x"):]
			end := 0
			for end < len(w) && w[end] >= '0' && w[end] <= '9' {
				end++
			}
			if n, err := strconv.Atoi(w[:end]); err == nil && n > 0 && n <= 32 {
				width = n
			}
		}
	}
	return gen, width
}
