package kb

import (
	"strconv"
	"strings"
)

// CompareDriver compares two dotted numeric versions ("535.129.03",
// "570.26", "12.4.1") field by field as numbers, a missing field counting as
// 0, so "570.26" < "570.124.06" and "12.4" == "12.4.0". It returns -1, 0 or
// +1. Surrounding space and a leading "v" or "r" ("R535") are ignored; a
// field that does not start with digits counts as 0, so malformed input
// compares low instead of failing.
func CompareDriver(a, b string) int {
	fa, fb := versionFields(a), versionFields(b)
	for i := 0; i < len(fa) || i < len(fb); i++ {
		var x, y uint64
		if i < len(fa) {
			x = fa[i]
		}
		if i < len(fb) {
			y = fb[i]
		}
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}

// versionFields splits a dotted version into its numeric fields.
func versionFields(v string) []uint64 {
	v = strings.TrimSpace(v)
	v = strings.TrimLeft(v, "vVrR")
	if v == "" {
		return nil
	}
	parts := strings.Split(v, ".")
	out := make([]uint64, len(parts))
	for i, p := range parts {
		n := 0
		for n < len(p) && p[n] >= '0' && p[n] <= '9' {
			n++
		}
		if n == 0 {
			continue
		}
		x, err := strconv.ParseUint(p[:n], 10, 64)
		if err != nil {
			// Only an overflow gets here: treat it as the largest value.
			x = ^uint64(0)
		}
		out[i] = x
	}
	return out
}

// majorMinor cuts a version to its first two fields ("12.2.2" -> "12.2").
func majorMinor(v string) string {
	parts := strings.SplitN(strings.TrimSpace(v), ".", 3)
	if len(parts) < 2 {
		return strings.Join(parts, ".")
	}
	return parts[0] + "." + parts[1]
}

// LowestDriver is the lowest Linux driver that runs the release at all: its
// own minimum, or the family's minor-version-compatibility floor when that is
// lower (CUDA 11.1 and later run on 450.80.02 in compatibility mode).
func (c CUDARelease) LowestDriver() string {
	if c.MinorCompatDriver != "" && CompareDriver(c.MinorCompatDriver, c.MinDriverLinux) < 0 {
		return c.MinorCompatDriver
	}
	return c.MinDriverLinux
}

// MaxCUDAForDriver returns the newest CUDA version, as "major.minor" the way
// nvidia-smi prints it, whose own minimum Linux driver the given driver
// meets ("535.129.03" -> "12.2"). It returns "" for a driver older than every
// release in the table or an empty string. Minor-version compatibility is not
// counted here: it is what CUDARelease.LowestDriver answers.
func (k *KB) MaxCUDAForDriver(driver string) string {
	if strings.TrimSpace(driver) == "" {
		return ""
	}
	best := ""
	for _, c := range k.CUDA {
		if CompareDriver(c.MinDriverLinux, driver) > 0 {
			continue
		}
		if best == "" || CompareDriver(c.Version, best) > 0 {
			best = c.Version
		}
	}
	return majorMinor(best)
}

// MinDriverForCUDA returns the release row for a CUDA version: the exact
// release ("12.4.1"), or for a bare "major.minor" ("12.4", "11.0") its first
// release in the table (the GA). The row's MinDriverLinux is the driver the
// toolkit shipped with ("12.4" -> 550.54.14).
func (k *KB) MinDriverForCUDA(cuda string) (CUDARelease, bool) {
	cuda = strings.TrimSpace(cuda)
	if cuda == "" {
		return CUDARelease{}, false
	}
	for _, c := range k.CUDA {
		if CompareDriver(c.Version, cuda) == 0 {
			return c, true
		}
	}
	if strings.Count(cuda, ".") != 1 {
		return CUDARelease{}, false
	}
	var best CUDARelease
	found := false
	for _, c := range k.CUDA {
		if majorMinor(c.Version) != cuda {
			continue
		}
		if !found || CompareDriver(c.Version, best.Version) < 0 {
			best, found = c, true
		}
	}
	return best, found
}
