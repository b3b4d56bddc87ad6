// Package hip is gpubench's Driver on AMD's HIP runtime (libamdhip64),
// loaded at run time with dlopen: the same kiln binary runs where ROCm is
// not installed and says so. Every call selects its device first
// (hipSetDevice) in the same C call; host memory placed by
// gpubench/hostmem is pinned with hipHostRegister; copies run with
// hipMemcpyAsync and hipMemcpyPeerAsync on non-blocking streams and are
// timed with events.
package hip

// Libraries are the names tried, in order, when no path is given: the
// development link, then the runtime sonames of ROCm 7, 6 and 5, then
// ROCm's default prefix.
var Libraries = []string{"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "/opt/rocm/lib/libamdhip64.so"}

// versionText prints a HIP version number (major*10000000 +
// minor*100000 + patch) as "6.1.40091".
func versionText(v int) string {
	if v <= 0 {
		return ""
	}
	return itoa(v/10000000) + "." + itoa(v/100000%100) + "." + itoa(v%100000)
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
