// Package nccl is gpubench's Collectives on NVIDIA's NCCL (libnccl) or
// AMD's RCCL (librccl), which share one API, loaded at run time with
// dlopen. Communicators are made for every local GPU at once
// (ncclCommInitAll); each operation is launched on every rank inside one
// group (ncclGroupStart/End), float32 elements, sum where it reduces.
package nccl

// Libraries are the names tried, in order, for each flavour.
var Libraries = map[string][]string{
	"nccl": {"libnccl.so.2", "libnccl.so"},
	"rccl": {"librccl.so.1", "librccl.so", "/opt/rocm/lib/librccl.so"},
}

// versionText prints NCCL's version code: major*10000 + minor*100 + patch
// from 2.9 on, major*1000 + minor*100 + patch before.
func versionText(v int) string {
	if v <= 0 {
		return ""
	}
	major, minor, patch := v/10000, v/100%100, v%100
	if v < 20900 {
		major, minor, patch = v/1000, v/100%10, v%100
	}
	return itoa(major) + "." + itoa(minor) + "." + itoa(patch)
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
