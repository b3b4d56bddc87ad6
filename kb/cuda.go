package kb

import (
	"strings"

	"kiln.dev/kiln/version"
)

// CompareDriver compares two versions ("535.129.03", "570.26", "12.4.1",
// "R535") as package version reads them: field by field as numbers, a
// missing field counting as 0, so "570.26" < "570.124.06" and "12.4" ==
// "12.4.0". It returns -1, 0 or +1. A version that does not parse ("",
// "N/A", "1.x") is unknown and sorts below every version that does (two
// unknowns are equal), so it is never at least a floor; a caller that must
// tell unknown from old uses version.Compare.
func CompareDriver(a, b string) int {
	va, errA := version.Parse(a)
	vb, errB := version.Parse(b)
	switch {
	case errA != nil && errB != nil:
		return 0
	case errA != nil:
		return -1
	case errB != nil:
		return 1
	}
	return va.Compare(vb)
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
