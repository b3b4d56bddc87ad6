package process

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/executor"
)

func TestEnvPerVendor(t *testing.T) {
	cases := []struct {
		name string
		devs []executor.Device
		want map[string]string
		not  []string
	}{
		{"two H100 by UUID", []executor.Device{
			{Vendor: "nvidia", Index: 2, UUID: "GPU-6a1f3e0c-52b7-4c0e-9d11-000000000002"},
			{Vendor: "nvidia", Index: 5, UUID: "GPU-6a1f3e0c-52b7-4c0e-9d11-000000000005"}},
			map[string]string{
				"CUDA_VISIBLE_DEVICES":   "GPU-6a1f3e0c-52b7-4c0e-9d11-000000000002,GPU-6a1f3e0c-52b7-4c0e-9d11-000000000005",
				"NVIDIA_VISIBLE_DEVICES": "GPU-6a1f3e0c-52b7-4c0e-9d11-000000000002,GPU-6a1f3e0c-52b7-4c0e-9d11-000000000005",
				"KILN_ISOLATION":         "exclusive"},
			[]string{"CUDA_DEVICE_ORDER", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "ROCR_VISIBLE_DEVICES"}},
		{"index without UUID keeps PCI order", []executor.Device{{Vendor: "nvidia", Index: 3}},
			map[string]string{"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, nil},
		{"MPS fraction", []executor.Device{{Vendor: "nvidia", Index: 1, UUID: "GPU-x", Share: &executor.Share{MilliGPU: 250, MemoryBytes: 20 << 30, Isolation: "mps"}}},
			map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M", "KILN_ISOLATION": "mps"}, nil},
		{"time-sliced share sets no MPS limits", []executor.Device{{Vendor: "amd", Index: 4, Share: &executor.Share{MilliGPU: 500, Isolation: "time-slicing"}}},
			map[string]string{"ROCR_VISIBLE_DEVICES": "4", "HIP_VISIBLE_DEVICES": "0", "KILN_ISOLATION": "time-slicing"},
			[]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_VISIBLE_DEVICES"}},
		{"three MI300X", []executor.Device{{Vendor: "amd", Index: 0}, {Vendor: "amd", Index: 6}, {Vendor: "amd", Index: 7}},
			map[string]string{"ROCR_VISIBLE_DEVICES": "0,6,7", "HIP_VISIBLE_DEVICES": "0,1,2"}, nil},
		{"MIG device", []executor.Device{{Vendor: "nvidia", Index: 0, UUID: "MIG-4b2a", Share: &executor.Share{MilliGPU: 142, Isolation: "mig"}}},
			map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-4b2a", "KILN_ISOLATION": "mig"}, []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}},
		{"Intel", []executor.Device{{Vendor: "intel", Index: 1}},
			map[string]string{"ZE_AFFINITY_MASK": "1", "ONEAPI_DEVICE_SELECTOR": "level_zero:1"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := Env(c.devs)
			for k, v := range c.want {
				if env[k] != v {
					t.Errorf("%s = %q, want %q", k, env[k], v)
				}
			}
			for _, k := range c.not {
				if _, ok := env[k]; ok {
					t.Errorf("%s set to %q, want unset", k, env[k])
				}
			}
		})
	}
}

func TestJobCannotChooseItsGPUs(t *testing.T) {
	got := environ([]string{"PATH=/bin", "CUDA_VISIBLE_DEVICES=0,1,2,3"},
		map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HIP_VISIBLE_DEVICES": "0", "SEED": "7"},
		map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a"})
	joined := strings.Join(got, " ")
	for _, want := range []string{"CUDA_VISIBLE_DEVICES=GPU-a", "SEED=7", "PATH=/bin"} {
		if !strings.Contains(joined, want) {
			t.Errorf("environment lacks %s: %s", want, joined)
		}
	}
	if strings.Contains(joined, "HIP_VISIBLE_DEVICES") || strings.Contains(joined, "0,1,2,3") {
		t.Errorf("job chose its own GPUs: %s", joined)
	}
}

func run(t *testing.T, job executor.Job) (executor.Exit, string) {
	t.Helper()
	e := &Executor{CgroupParent: filepath.Join(t.TempDir(), "nocgroup", "kiln")}
	h, err := e.Start(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ex, err := h.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Logs()
	b, _ := io.ReadAll(r)
	r.Close()
	return ex, string(b)
}

func TestRunCapturesOutputWithGPUEnv(t *testing.T) {
	ex, out := run(t, executor.Job{ID: "j-1", LeaseID: "l-1",
		Command: []string{"/bin/sh", "-c", `echo "cuda=$CUDA_VISIBLE_DEVICES mps=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE lease=$KILN_LEASE_ID"; echo oops >&2; exit 3`},
		Devices: []executor.Device{{Vendor: "nvidia", Index: 2, UUID: "GPU-2", Share: &executor.Share{MilliGPU: 500, MemoryBytes: 1 << 30, Isolation: "mps"}}}})
	if ex.Code != 3 || ex.Reason != "exited" {
		t.Errorf("exit %+v, want code 3 exited", ex)
	}
	if !strings.Contains(out, "cuda=GPU-2 mps=50 lease=l-1") || !strings.Contains(out, "oops") {
		t.Errorf("output %q", out)
	}
}

func TestCgroupLimitsNoteWhenUnavailable(t *testing.T) {
	_, out := run(t, executor.Job{ID: "j-2", Command: []string{"/bin/true"}, Limits: executor.Limits{MemoryBytes: 1 << 30}})
	if !strings.Contains(out, "cgroup limits not applied") {
		t.Errorf("no note about cgroup limits: %q", out)
	}
}

func TestStopTermThenKill(t *testing.T) {
	e := &Executor{}
	// The job ignores SIGTERM: it is killed after the grace period.
	h, err := e.Start(context.Background(), executor.Job{ID: "j-3", Command: []string{"/bin/sh", "-c", `trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	r := h.Logs()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("read %q %v", buf, err)
	}
	start := time.Now()
	if err := h.Stop(context.Background(), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("stopped after %s, before the grace period", d)
	}
	ex, _ := h.Wait(context.Background())
	if ex.Signal != "killed" || ex.Reason != "killed" {
		t.Errorf("exit %+v, want killed by SIGKILL", ex)
	}
	rest, _ := io.ReadAll(r)
	if !strings.Contains(string(rest), "got-term") {
		t.Errorf("the job never saw SIGTERM: %q", rest)
	}
}

func TestStartFailsForMissingProgram(t *testing.T) {
	e := &Executor{}
	if _, err := e.Start(context.Background(), executor.Job{ID: "j-4", Command: []string{"/no/such/program"}}); err == nil {
		t.Fatal("started a missing program")
	}
}
