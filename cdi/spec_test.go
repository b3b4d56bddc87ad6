package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/snapshot"
)

func device(t *testing.T, s *cdispec.Spec, name string) *cdispec.Device {
	t.Helper()
	for i := range s.Devices {
		if s.Devices[i].Name == name {
			return &s.Devices[i]
		}
	}
	t.Fatalf("no device %q in spec; have %v", name, deviceNames(s))
	return nil
}

func deviceNames(s *cdispec.Spec) []string {
	var n []string
	for _, d := range s.Devices {
		n = append(n, d.Name)
	}
	return n
}

func node(t *testing.T, d *cdispec.Device, p string) *cdispec.DeviceNode {
	t.Helper()
	for _, n := range d.ContainerEdits.DeviceNodes {
		if n.Path == p {
			return n
		}
	}
	t.Fatalf("device %q has no node %s; has %v", d.Name, p, nodePaths(d.ContainerEdits.DeviceNodes))
	return nil
}

func TestNVIDIAFromH100Capture(t *testing.T) {
	s := load(t, h100Capture)
	res, err := Generate(s, Options{Root: nvidiaHost(s)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Notes) != 0 {
		t.Errorf("notes on a fully described host: %v", res.Notes)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	if res.Spec.Kind != "kiln.dev/gpu" {
		t.Errorf("kind %q", res.Spec.Kind)
	}
	// 8 GPUs by index, 8 by UUID, and "all".
	if got := len(res.Spec.Devices); got != 17 {
		t.Errorf("%d devices, want 17: %v", got, deviceNames(res.Spec))
	}
	// GPU 2 is 0000:75:00.0, the third NVIDIA function: /dev/nvidia2.
	d2 := device(t, res.Spec, "2")
	n := node(t, d2, "/dev/nvidia2")
	if n.Type != "c" || n.Major != 195 || n.Minor != 2 {
		t.Errorf("/dev/nvidia2 = %s %d:%d, want c 195:2", n.Type, n.Major, n.Minor)
	}
	if n := node(t, d2, "/dev/nvidiactl"); n.Major != 195 || n.Minor != 255 {
		t.Errorf("nvidiactl %d:%d", n.Major, n.Minor)
	}
	if n := node(t, d2, "/dev/nvidia-uvm"); n.Major != 510 || n.Minor != 0 {
		t.Errorf("nvidia-uvm %d:%d, want 510:0 from /proc/devices", n.Major, n.Minor)
	}
	if n := node(t, d2, "/dev/nvidia-uvm-tools"); n.Major != 510 || n.Minor != 1 {
		t.Errorf("nvidia-uvm-tools %d:%d, want 510:1", n.Major, n.Minor)
	}
	for _, n := range d2.ContainerEdits.DeviceNodes {
		if n.Path == "/dev/nvidia0" || n.Path == "/dev/nvidia3" {
			t.Errorf("GPU 2's device gives another GPU's node %s", n.Path)
		}
	}
	byUUID := device(t, res.Spec, "GPU-973565ff-45cf-12ea-4e91-33386720f7bb")
	if !slices.Equal(nodePaths(byUUID.ContainerEdits.DeviceNodes), nodePaths(d2.ContainerEdits.DeviceNodes)) {
		t.Errorf("UUID device %v differs from index device %v", nodePaths(byUUID.ContainerEdits.DeviceNodes), nodePaths(d2.ContainerEdits.DeviceNodes))
	}
	all := device(t, res.Spec, "all")
	if got := len(all.ContainerEdits.DeviceNodes); got != 11 {
		t.Errorf("all has %d nodes, want 8 GPUs + 3 shared: %v", got, nodePaths(all.ContainerEdits.DeviceNodes))
	}
	var info *Device
	for i := range res.Devices {
		if res.Devices[i].Name == "2" {
			info = &res.Devices[i]
		}
	}
	if info == nil || info.PCIAddress != "0000:75:00.0" || info.QualifiedName != "kiln.dev/gpu=2" || info.UUID != "GPU-973565ff-45cf-12ea-4e91-33386720f7bb" {
		t.Errorf("device 2 = %+v", info)
	}
}

func TestNVIDIAUnknownMinorIsLeftOut(t *testing.T) {
	s := load(t, h100Capture)
	root := nvidiaHost(s)
	delete(root, "proc/driver/nvidia/gpus/0000:75:00.0/information")
	res, err := Generate(s, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range res.Spec.Devices {
		if d.Name == "2" {
			t.Fatal("GPU 2 without a known minor got a device")
		}
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "GPU 2 (0000:75:00.0) left out") {
		t.Errorf("notes %q", res.Notes)
	}

	// A host that says nothing: no device at all, said plainly.
	res, err = Generate(s, Options{Root: fstest.MapFS{}})
	if !errors.Is(err, ErrNoDevices) {
		t.Fatalf("err %v, want ErrNoDevices", err)
	}
	if len(res.Notes) < 8 {
		t.Errorf("want a note per GPU, got %q", res.Notes)
	}
}

func TestAssumeNodesForRecordedMachines(t *testing.T) {
	s := load(t, h100Capture)
	res, err := Generate(s, Options{Root: fstest.MapFS{}, AssumeNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	n := node(t, device(t, res.Spec, "5"), "/dev/nvidia5")
	if n.Major != 195 || n.Minor != 5 {
		t.Errorf("assumed /dev/nvidia5 = %d:%d", n.Major, n.Minor)
	}
	// uvm's major is unknown: the node is listed bare and the runtime
	// reads it from the host when it injects.
	if n := node(t, device(t, res.Spec, "5"), "/dev/nvidia-uvm"); n.Type != "" || n.Major != 0 {
		t.Errorf("unknown uvm major filled in: %+v", n)
	}
	if !slices.ContainsFunc(res.Notes, func(s string) bool { return strings.Contains(s, "assumed /dev/nvidia5") }) {
		t.Errorf("assumption not noted: %q", res.Notes)
	}
}

func TestMIGInstances(t *testing.T) {
	s := load(t, migCapture)
	res, err := Generate(s, Options{Root: nvidiaHost(s)})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	// The capture's A100 holds GPU instances 3, 4, 5, 6, each with compute
	// instance 0.
	for _, gi := range []int{3, 4, 5, 6} {
		name := MIGName(0, gi, 0)
		d := device(t, res.Spec, name)
		giMinor, ciMinor := int64(3+9*gi), int64(3+9*gi+1)
		node(t, d, "/dev/nvidia0")
		for _, m := range []int64{giMinor, ciMinor} {
			n := node(t, d, "/dev/nvidia-caps/nvidia-cap"+itoa(m))
			if n.Major != 508 || n.Minor != m || n.Type != "c" {
				t.Errorf("%s: cap node %+v, want c 508:%d", name, n, m)
			}
		}
	}
	// gi 3 must not get gi 4's capabilities.
	for _, n := range device(t, res.Spec, "0:3:0").ContainerEdits.DeviceNodes {
		if n.Path == "/dev/nvidia-caps/nvidia-cap39" {
			t.Error("MIG 0:3:0 got gi 4's access node")
		}
	}
	// Without mig-minors the instances are left out, the GPU stays.
	root := nvidiaHost(s)
	delete(root, "proc/driver/nvidia-caps/mig-minors")
	res, err = Generate(s, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceNames(res.Spec); !slices.Equal(got, []string{"0", "GPU-513536b6-7d19-9063-b049-1e69664bb298", "all"}) {
		t.Errorf("devices %v", got)
	}
	if len(res.Notes) != 4 {
		t.Errorf("want one note per MIG instance, got %q", res.Notes)
	}
}

func itoa(n int64) string { return GPUName(int(n)) }

func TestAMDFromKFDTopology(t *testing.T) {
	s := load(t, mi210KFD)
	res, err := Generate(s, Options{Root: kfdHost(t, mi210KFD)})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	// GPU 2 (0000:43:00.0) is KFD node 3, whose drm_render_minor is 129.
	d := device(t, res.Spec, "2")
	if n := node(t, d, "/dev/dri/renderD129"); n.Major != 226 || n.Minor != 129 {
		t.Errorf("renderD129 = %d:%d", n.Major, n.Minor)
	}
	if n := node(t, d, "/dev/kfd"); n.Major != 234 {
		t.Errorf("/dev/kfd major %d, want 234 from /proc/devices", n.Major)
	}
	if len(d.ContainerEdits.DeviceNodes) != 2 {
		t.Errorf("GPU 2 nodes %v", nodePaths(d.ContainerEdits.DeviceNodes))
	}
	all := device(t, res.Spec, "all")
	if got := len(all.ContainerEdits.DeviceNodes); got != 9 {
		t.Errorf("all: %d nodes, want 8 render nodes + kfd", got)
	}
}

func TestAMDPartitionsGetEveryRenderNode(t *testing.T) {
	s := load(t, mi300xKFD)
	res, err := Generate(s, Options{Root: kfdHost(t, mi300xKFD)})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	// MI300X in CPX mode: GPU 0 is 8 partitions (KFD nodes 2-9), each
	// with its own render node.
	d := device(t, res.Spec, "0")
	var render []string
	for _, n := range d.ContainerEdits.DeviceNodes {
		if strings.HasPrefix(n.Path, "/dev/dri/renderD") {
			render = append(render, n.Path)
		}
	}
	if len(render) != 8 {
		t.Errorf("GPU 0 render nodes %v, want 8 (one per CPX partition)", render)
	}
}

func TestAMDWithoutHostFactsIsLeftOut(t *testing.T) {
	s := load(t, mi210KFD)
	res, err := Generate(s, Options{Root: fstest.MapFS{}})
	if !errors.Is(err, ErrNoDevices) {
		t.Fatalf("err %v", err)
	}
	if len(res.Notes) == 0 || !strings.Contains(res.Notes[0], "render node is unknown") {
		t.Errorf("notes %q", res.Notes)
	}
}

func TestIntelFromSysfs(t *testing.T) {
	s := &snapshot.Snapshot{GPUs: []snapshot.GPU{{Index: 0, Vendor: snapshot.VendorIntel, PCIAddress: "0000:03:00.0"}}}
	root := fstest.MapFS{
		"sys/bus/pci/devices/0000:03:00.0/drm/card1/dev":       {Data: []byte("226:1\n")},
		"sys/bus/pci/devices/0000:03:00.0/drm/renderD128/dev":  {Data: []byte("226:128\n")},
		"sys/bus/pci/devices/0000:03:00.0/drm/controlD64/dev":  {Data: []byte("226:64\n")},
		"sys/bus/pci/devices/0000:03:00.0/drm/renderDx/ignore": {Data: []byte("x")},
	}
	res, err := Generate(s, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	d := device(t, res.Spec, "0")
	if got := nodePaths(d.ContainerEdits.DeviceNodes); !slices.Equal(got, []string{"/dev/dri/card1", "/dev/dri/renderD128"}) {
		t.Errorf("nodes %v", got)
	}
}

func TestDriverFilesMountedWithSoname(t *testing.T) {
	root := fstest.MapFS{
		"usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01":      {Data: elfLibrary("libcuda.so.1")},
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01": {Data: elfLibrary("libnvidia-ml.so.1")},
		"usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.535.183.01": {
			Data: elfLibrary("libnvidia-nvvm.so.4"),
		},
		"usr/lib/x86_64-linux-gnu/libcuda.so.530.30.02": {Data: elfLibrary("libcuda.so.1")},
		"usr/bin/nvidia-smi":                            {Data: []byte("#!")},
		"usr/bin/nvidia-cuda-mps-control":               {Data: []byte("#!")},
	}
	libs, bins := FindNVIDIADriverFiles(root, "535.183.01")
	wantLibs := []string{
		"/usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01",
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01",
		"/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.535.183.01",
	}
	if !slices.Equal(libs, wantLibs) {
		t.Errorf("libraries %v, want %v (the 530 library is another driver's)", libs, wantLibs)
	}
	if !slices.Equal(bins, []string{"/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control"}) {
		t.Errorf("binaries %v", bins)
	}

	s := load(t, h100Capture)
	host := nvidiaHost(s)
	for k, v := range root {
		host[k] = v
	}
	res, err := Generate(s, Options{Root: host, NVIDIALibraries: libs, NVIDIABinaries: bins})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{}
	for _, m := range device(t, res.Spec, "0").ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
		if !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nodev") {
			t.Errorf("mount %s options %v", m.ContainerPath, m.Options)
		}
	}
	want := map[string]string{
		"/usr/local/nvidia/lib64/libcuda.so.535.183.01":        "/usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01",
		"/usr/local/nvidia/lib64/libcuda.so.1":                 "/usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01",
		"/usr/local/nvidia/lib64/libnvidia-ml.so.535.183.01":   "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01",
		"/usr/local/nvidia/lib64/libnvidia-ml.so.1":            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01",
		"/usr/local/nvidia/lib64/libnvidia-nvvm.so.535.183.01": "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.535.183.01",
		"/usr/local/nvidia/lib64/libnvidia-nvvm.so.4":          "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.535.183.01",
		"/usr/local/nvidia/bin/nvidia-smi":                     "/usr/bin/nvidia-smi",
		"/usr/local/nvidia/bin/nvidia-cuda-mps-control":        "/usr/bin/nvidia-cuda-mps-control",
	}
	if len(mounts) != len(want) {
		t.Errorf("mounts %v", mounts)
	}
	for c, h := range want {
		if mounts[c] != h {
			t.Errorf("mount %s <- %q, want %q", c, mounts[c], h)
		}
	}

	if _, err := Generate(s, Options{Root: host, LibraryDir: "lib"}); err == nil {
		t.Error("relative library dir accepted")
	}
	res, _ = Generate(s, Options{Root: host, NVIDIALibraries: []string{"relative/libcuda.so"}})
	if !slices.ContainsFunc(res.Notes, func(n string) bool { return strings.Contains(n, "relative/libcuda.so") }) {
		t.Errorf("bad library path not noted: %q", res.Notes)
	}
}

func TestWriteInject(t *testing.T) {
	s := load(t, h100Capture)
	res, err := Generate(s, Options{Root: nvidiaHost(s)})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	p, err := Write(res.Spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(dir, SpecFile) {
		t.Errorf("written to %s", p)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("spec file %v %v", st, err)
	}

	oci := &rspec.Spec{Process: &rspec.Process{}, Linux: &rspec.Linux{}}
	if err := Inject(oci, []string{dir}, QualifiedName("3")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range oci.Linux.Devices {
		got = append(got, d.Path)
	}
	if !slices.Contains(got, "/dev/nvidia3") || slices.Contains(got, "/dev/nvidia2") || !slices.Contains(got, "/dev/nvidiactl") {
		t.Errorf("injected devices %v", got)
	}
	allowed := false
	for _, r := range oci.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 195 && r.Minor != nil && *r.Minor == 3 {
			allowed = true
		}
	}
	if !allowed {
		t.Errorf("no cgroup rule allows 195:3: %+v", oci.Linux.Resources.Devices)
	}

	err = Inject(oci, []string{dir}, QualifiedName("9"))
	if err == nil || !strings.Contains(err.Error(), "no such device kiln.dev/gpu=9") {
		t.Errorf("unknown device: %v", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := Inject(oci, []string{dir}, QualifiedName("3")); err == nil {
		t.Error("injected from a removed spec")
	}
}

func TestValidateRejectsBadSpec(t *testing.T) {
	bad := &cdispec.Spec{Version: cdispec.CurrentVersion, Kind: Kind, Devices: []cdispec.Device{{
		Name:           "0",
		ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", Type: "x"}}},
	}}}
	err := Validate(bad)
	if err == nil || !strings.Contains(err.Error(), `invalid type "x"`) {
		t.Errorf("err %v", err)
	}
	if _, err := Write(bad, t.TempDir()); err == nil {
		t.Error("wrote an invalid spec")
	}
}

func TestDuplicateAndOddNames(t *testing.T) {
	s := &snapshot.Snapshot{GPUs: []snapshot.GPU{
		{Index: 0, Vendor: "nvidia", UUID: "GPU-a"},
		{Index: 0, Vendor: "nvidia", UUID: "GPU-b"},
		{Index: 1, Vendor: "nvidia", UUID: "MIG-GPU-a/1/0"},
		{Index: 2, Vendor: "mystery"},
	}}
	res, err := Generate(s, Options{Root: fstest.MapFS{}, AssumeNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(res.Spec); err != nil {
		t.Fatal(err)
	}
	if got := deviceNames(res.Spec); !slices.Equal(got, []string{"0", "GPU-a", "1", "all"}) {
		t.Errorf("devices %v", got)
	}
	joined := strings.Join(res.Notes, "\n")
	for _, want := range []string{"/dev/nvidia0 is already GPU 0's", `"MIG-GPU-a/1/0" left out`, `vendor "mystery"`} {
		if !strings.Contains(joined, want) {
			t.Errorf("no note %q in %q", want, joined)
		}
	}
}
