package dra_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"kiln.dev/kiln/dra"
)

func TestNodeLabels(t *testing.T) {
	cases := map[string]map[string]string{
		"hgx-h100-sysfs": {
			"kiln.dev/gpu": "true", "kiln.dev/gpu.count": "8", "kiln.dev/nvlink-island.max": "8", "kiln.dev/doctor": "warning",
			"kiln.dev/cuda-driver-version": "12.2.0", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "H100-SXM5-80GB",
			"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver-version.full": "12.2",
			"nvidia.com/gpu.driver.major": "535", "nvidia.com/gpu.driver.rev": "1", "nvidia.com/mig.capable": "false", "nvidia.com/gpu.family": "hopper",
		},
		"mi300x-cpx": {
			"kiln.dev/gpu.count": "8", "kiln.dev/gfx-target": "gfx942", "kiln.dev/nvlink-island.max": "0", "kiln.dev/doctor": "healthy",
			"amd.com/gpu.count": "8", "amd.com/gpu.family": "CDNA3", "amd.com/compute-partitioning-mode": "cpx",
		},
		"rtx2080ti-xid-critical": {"kiln.dev/doctor": "critical", "kiln.dev/gpu.count": "4"},
		"mig-h100-no-instances":  {"nvidia.com/mig.capable": "true", "kiln.dev/cuda-driver-version": "13.1.0"},
	}
	for name, want := range cases {
		r := buildMachine(t, machineByName(t, name))
		got, own := dra.NodeLabels(r, nil, nil)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s=%q, want %q", name, k, got[k], v)
			}
		}
		for k, v := range got {
			if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
				t.Errorf("%s: label %s=%s: %v", name, k, v, msgs)
			}
		}
		if len(own) == 0 {
			t.Errorf("%s: kiln owns no vendor prefix on a node without other labellers", name)
		}
	}

	// GPU Feature Discovery runs on the node: its keys are left to it.
	r := buildMachine(t, machineByName(t, "hgx-h100-sysfs"))
	got, own := dra.NodeLabels(r, map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, nil)
	for k := range got {
		if len(k) > 11 && k[:11] == "nvidia.com/" {
			t.Errorf("wrote %s beside GPU Feature Discovery", k)
		}
	}
	if len(own) != 0 || got["kiln.dev/nvlink-island.max"] != "8" {
		t.Errorf("own %v, labels %v", own, got)
	}
	// ...unless kiln wrote them itself before.
	got, _ = dra.NodeLabels(r, map[string]string{"nvidia.com/gpu.product": "H100-SXM5-80GB"}, []string{"nvidia.com/"})
	if got["nvidia.com/gpu.count"] != "8" {
		t.Errorf("kiln's own nvidia.com labels not kept up: %v", got)
	}
}
