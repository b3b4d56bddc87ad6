package process

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/executor"
)

// visibilityVars are the variables that choose GPUs; a job cannot set them
// itself, and the agent's own values are not passed on.
var visibilityVars = []string{
	"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
	"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
	"ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
	"ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR",
}

// Env is the environment that gives a job its devices and only those:
//
//   - NVIDIA: CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES list the
//     GPUs (or MIG devices) by UUID when every device has one, else by
//     index with CUDA_DEVICE_ORDER=PCI_BUS_ID so that indexes mean what
//     nvidia-smi shows. A fraction enforced by MPS adds
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (its compute share) and
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (its memory, per visible device).
//   - AMD: ROCR_VISIBLE_DEVICES lists the GPUs by index; HIP numbers the
//     GPUs left visible from 0, so HIP_VISIBLE_DEVICES is 0..n-1.
//   - Intel: ZE_AFFINITY_MASK and ONEAPI_DEVICE_SELECTOR.
//
// KILN_ISOLATION says what isolation the job really has: exclusive, mig,
// mps or time-slicing.
func Env(devs []executor.Device) map[string]string {
	env := map[string]string{}
	byVendor := map[string][]executor.Device{}
	for _, d := range devs {
		byVendor[d.Vendor] = append(byVendor[d.Vendor], d)
	}
	if nv := byVendor["nvidia"]; len(nv) > 0 {
		ids := make([]string, len(nv))
		allUUID := true
		for _, d := range nv {
			allUUID = allUUID && d.UUID != ""
		}
		for i, d := range nv {
			if allUUID {
				ids[i] = d.UUID
			} else {
				ids[i] = strconv.Itoa(d.Index)
			}
		}
		env["CUDA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
		env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
		if !allUUID {
			env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
		}
		var limits []string
		pct := 0
		for i, d := range nv {
			if d.Share == nil || d.Share.Isolation != "mps" {
				continue
			}
			pct = max(pct, max(d.Share.MilliGPU/10, 1))
			if d.Share.MemoryBytes > 0 {
				limits = append(limits, fmt.Sprintf("%d=%dM", i, max(d.Share.MemoryBytes>>20, 1)))
			}
		}
		if pct > 0 {
			env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(pct)
		}
		if len(limits) > 0 {
			env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = strings.Join(limits, ",")
		}
	}
	if amd := byVendor["amd"]; len(amd) > 0 {
		rocr := make([]string, len(amd))
		hip := make([]string, len(amd))
		for i, d := range amd {
			rocr[i] = strconv.Itoa(d.Index)
			hip[i] = strconv.Itoa(i)
		}
		env["ROCR_VISIBLE_DEVICES"] = strings.Join(rocr, ",")
		env["HIP_VISIBLE_DEVICES"] = strings.Join(hip, ",")
	}
	if intel := byVendor["intel"]; len(intel) > 0 {
		ids := make([]string, len(intel))
		for i, d := range intel {
			ids[i] = strconv.Itoa(d.Index)
		}
		env["ZE_AFFINITY_MASK"] = strings.Join(ids, ",")
		env["ONEAPI_DEVICE_SELECTOR"] = "level_zero:" + strings.Join(ids, ",")
	}
	iso := "exclusive"
	rank := map[string]int{"exclusive": 0, "mig": 1, "mps": 2, "time-slicing": 3}
	for _, d := range devs {
		if d.Share != nil && rank[d.Share.Isolation] > rank[iso] {
			iso = d.Share.Isolation
		}
	}
	if len(devs) > 0 {
		env["KILN_ISOLATION"] = iso
	}
	return env
}

// environ merges the agent's environment (less GPU choices), the job's
// and the device variables, which win.
func environ(base []string, job map[string]string, devs map[string]string) []string {
	m := map[string]string{}
	for _, kv := range base {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			m[k] = v
		}
	}
	for _, k := range visibilityVars {
		delete(m, k)
	}
	for k, v := range job {
		m[k] = v
	}
	for _, k := range visibilityVars {
		if _, own := devs[k]; !own {
			delete(m, k) // a job may not pick its own GPUs
		}
	}
	for k, v := range devs {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
