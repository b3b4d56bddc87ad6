package dra

import (
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/snapshot"
)

// TaintKey is the device taint key of a doctor finding: the driver's
// domain and the finding's id ("gpu.kiln.dev/xid-error").
func TaintKey(findingID string) string { return DriverName + "/" + findingID }

// maxTaints is the API's limit of taints per device.
const maxTaints = resourceapi.DeviceTaintsMaxLength

// health turns the doctor's findings into each GPU's health and taints. A
// critical finding taints the GPUs it names NoSchedule, a warning adds an
// informational taint (effect None); a critical finding that names no GPU
// of the node (the fabric manager is down, the driver cannot be reached)
// taints every GPU, as it makes the whole node unusable. Informational
// findings leave the GPU healthy.
func (b *builder) health() {
	byPCI := map[string]*gpuFacts{}
	for _, f := range b.gpus {
		f.health = HealthHealthy
		if f.pci != "" {
			byPCI[f.pci] = f
		}
	}
	for _, fd := range b.rep.Findings {
		if fd.Severity != doctor.Critical && fd.Severity != doctor.Warning {
			continue
		}
		var hit []*gpuFacts
		for _, d := range fd.Devices {
			c, err := snapshot.CanonicalPCI(d)
			if err != nil {
				continue
			}
			if f, ok := byPCI[c]; ok && !slices.Contains(hit, f) {
				hit = append(hit, f)
			}
		}
		if len(hit) == 0 {
			if fd.Severity != doctor.Critical {
				continue
			}
			hit = b.gpus
		}
		for _, f := range hit {
			f.addTaint(fd)
		}
	}
	for _, f := range b.gpus {
		// Hard effects first, then by key, so that the limit keeps the
		// findings that matter.
		slices.SortStableFunc(f.taints, func(x, y resourceapi.DeviceTaint) int {
			if ex, ey := effectRank(x.Effect), effectRank(y.Effect); ex != ey {
				return ex - ey
			}
			return strings.Compare(x.Key, y.Key)
		})
		if len(f.taints) > maxTaints {
			f.taints = f.taints[:maxTaints]
		}
	}
}

func effectRank(e resourceapi.DeviceTaintEffect) int {
	if e == resourceapi.DeviceTaintEffectNoSchedule {
		return 0
	}
	return 1
}

// addTaint adds the taint of one finding; a second finding with the same
// id keeps one taint, the harder effect winning.
func (f *gpuFacts) addTaint(fd doctor.Finding) {
	effect := resourceapi.DeviceTaintEffectNone
	if fd.Severity == doctor.Critical {
		effect = resourceapi.DeviceTaintEffectNoSchedule
		f.health = HealthCritical
	} else if f.health == HealthHealthy {
		f.health = HealthWarning
	}
	key := TaintKey(fd.ID)
	value := taintValue(fd)
	for i := range f.taints {
		t := &f.taints[i]
		if t.Key != key {
			continue
		}
		if effect == resourceapi.DeviceTaintEffectNoSchedule && t.Effect != effect {
			t.Effect, t.Value = effect, value
		}
		return
	}
	f.taints = append(f.taints, resourceapi.DeviceTaint{Key: key, Value: value, Effect: effect})
}

// taintValue is a short value for a finding's taint: the code where the
// finding has one ("xid-79"), else its severity.
func taintValue(fd doctor.Finding) string {
	if fd.Code != 0 {
		return labelValue(fd.ID + "-" + strconv.Itoa(fd.Code))
	}
	return fd.Severity.String()
}
