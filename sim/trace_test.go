package sim

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// traceDir is the Alibaba trace, relative to this package; tests that need
// it skip when it is absent.
const traceDir = "../../shared/traces/alibaba-gpu-2023"

func needTrace(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(traceDir, NodeFile)); err != nil {
		t.Skipf("the Alibaba GPU trace is not at %s (research-use data, kept outside the repository): %v", traceDir, err)
	}
}

func TestReadRealTrace(t *testing.T) {
	needTrace(t)
	tr, err := LoadTrace(traceDir, "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Nodes) != 1213 || len(tr.Pods) != 8152 {
		t.Fatalf("%d nodes, %d pods; want 1213 and 8152", len(tr.Nodes), len(tr.Pods))
	}
	var gpus int
	var req int64
	share, multi, cpu := 0, 0, 0
	for _, n := range tr.Nodes {
		gpus += n.GPUs
	}
	for _, p := range tr.Pods {
		req += p.GPUTotal()
		switch {
		case !p.WantsGPU():
			cpu++
		case p.Sharing():
			share++
		case p.GPUs > 1:
			multi++
		}
	}
	if gpus != 6212 || req != 6086800 || cpu != 1088 || share != 3078 || multi != 75 {
		t.Errorf("GPUs %d, request %d milli, CPU-only %d, sharing %d, multi-GPU %d; want 6212, 6086800, 1088, 3078, 75", gpus, req, cpu, share, multi)
	}
	p0 := tr.Pods[0]
	if p0.Name != "openb-pod-0000" || p0.CPU != 12000 || p0.Memory != 16384 || p0.GPUs != 1 || p0.GPUMilli != 1000 || p0.QoS != "LS" || p0.Created != 0 || p0.Deleted != 12537496 {
		t.Errorf("first pod %+v", p0)
	}
	spec, err := LoadTrace(traceDir, "gpuspec33")
	if err != nil {
		t.Fatal(err)
	}
	with := 0
	for _, p := range spec.Pods {
		if len(p.Models) > 0 {
			with++
		}
	}
	if with != 2388 {
		t.Errorf("gpuspec33: %d tasks with a model constraint, want 2388", with)
	}
	mg, err := LoadTrace(traceDir, "multigpu20")
	if err != nil {
		t.Fatal(err)
	}
	if len(mg.Pods) != 8324 || mg.Pods[0].Created != -1 {
		t.Errorf("multigpu20 (5 columns): %d pods, times %d", len(mg.Pods), mg.Pods[0].Created)
	}
}

func TestBadCSVGivesClearErrors(t *testing.T) {
	head := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
	cases := []struct {
		in, want string
	}{
		{"", "empty file"},
		{"name,cpu_milli\n", `lacks column(s) memory_mib, num_gpu, gpu_milli`},
		{head, "no tasks"},
		{head + "p1,abc,10,1,500,\n", `line 2: cannot read "abc" in column cpu_milli as a whole number`},
		{head + "p1,1000,10,1,1500,\n", "line 2: column gpu_milli is 1500, want 0..1000"},
		{head + "p1,-5,10,1,500,\n", "line 2: column cpu_milli is -5"},
		{head + "p1,1000,10,2,500,\n", "only single-GPU tasks may share a GPU"},
		{head + "p1,1000,10,1,0,\n", "asks for 1 GPU(s) with gpu_milli 0"},
		{head + "p1,1000,,1,500,\n", "line 2: column memory_mib is empty"},
		{head + "p1,1000,10,1,500,\"T4\n", "line 2"},
	}
	for _, c := range cases {
		_, err := ReadPods(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadPods(%q): error %v, want it to say %q", c.in, err, c.want)
		}
	}
	_, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn1,96000,1024,99,G2\n"))
	if err == nil || !strings.Contains(err.Error(), "column gpu is 99, want 0..64") {
		t.Errorf("ReadNodes with 99 GPUs: %v", err)
	}
	ps, err := ReadPods(strings.NewReader(head + "p1,1000.0,10,1,500, V100M16 | V100M32 \np2,2000,0,0,0,T4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ps[0].CPU != 1000 || len(ps[0].Models) != 2 || ps[0].Models[1] != "V100M32" || ps[1].Models != nil || ps[1].Created != -1 {
		t.Errorf("parsed %+v", ps)
	}
}

// FuzzReadPods checks that any input gives tasks or an error, never a
// panic, and that what is read is sane.
func FuzzReadPods(f *testing.F) {
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,2,1,1000\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\np,1,2,8,1000,G2|T4,LS,Running,0,5,\n")
	for _, name := range []string{"default", "multigpu50", "gpuspec33"} {
		if fh, err := os.Open(filepath.Join(traceDir, PodFile(name))); err == nil {
			var b strings.Builder
			s := bufio.NewScanner(fh)
			for i := 0; i < 40 && s.Scan(); i++ {
				b.WriteString(s.Text() + "\n")
			}
			fh.Close()
			f.Add(b.String())
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		pods, err := ReadPods(strings.NewReader(in))
		if err != nil {
			if pods != nil {
				t.Fatal("tasks and an error")
			}
			return
		}
		for _, p := range pods {
			if p.CPU < 0 || p.Memory < 0 || p.GPUs < 0 || p.GPUMilli < 0 || p.GPUMilli > 1000 {
				t.Fatalf("bad task %+v", p)
			}
			if p.GPUs > 1 && p.GPUMilli != 1000 || p.GPUs == 0 && p.GPUMilli != 0 {
				t.Fatalf("inconsistent GPU request %+v", p)
			}
		}
	})
}

func FuzzReadNodes(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn,96000,393216,8,G2\n")
	if b, err := os.ReadFile(filepath.Join(traceDir, NodeFile)); err == nil {
		f.Add(string(b[:min(len(b), 2000)]))
	}
	f.Fuzz(func(t *testing.T, in string) {
		nodes, err := ReadNodes(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, n := range nodes {
			if n.CPU < 0 || n.Memory < 0 || n.GPUs < 0 || n.GPUs > maxNodeGPUs || (n.GPUs == 0 && n.Model != "") {
				t.Fatalf("bad node %+v", n)
			}
		}
	})
}
