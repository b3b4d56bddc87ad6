package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/dra/plugin"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
	"kiln.dev/kiln/testenv"
	"kiln.dev/kiln/version"
)

var (
	cp      *ControlPlane
	skipWhy string
	logFile string
)

func TestMain(m *testing.M) {
	code := func() int {
		if _, err := BinDir(); err != nil {
			skipWhy = err.Error()
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "kiln-kube-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		logFile = filepath.Join(dir, "control-plane.log")
		lf, err := os.Create(logFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer lf.Close()
		t0 := time.Now()
		cp, err = Start(context.Background(), dir, Options{ControllerManager: true, Log: lf})
		if err != nil {
			fmt.Fprintln(os.Stderr, "starting the control plane:", err)
			return 1
		}
		defer cp.Stop()
		fmt.Fprintf(os.Stderr, "control plane ready in %s\n", time.Since(t0).Round(time.Millisecond))
		return m.Run()
	}()
	os.Exit(code)
}

func need(t testing.TB) {
	t.Helper()
	if cp == nil {
		t.Skip("no Kubernetes control plane: " + skipWhy)
	}
}

// recorded are the machines published as nodes, with their node names.
var recorded = map[string]string{
	"hgx-h100-sysfs":         "testdata/fixtures/h100-hgx8-sysfs",
	"hgx-h100-smi":           "testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt",
	"hgx-a100-topo":          "testdata/captures/nvidia-smi-topo/a100x8-nv12-17nic-topo-m.txt",
	"pcie-l40s-pairs":        "testdata/fixtures/pcie4-downtrained-acs",
	"pcie-rtx4090-two-roots": "testdata/fixtures/consumer2-nop2p",
	"mig-a100-instances":     "testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml",
	"mig-h100-no-instances":  "testdata/captures/nvidia-smi-q/h100-vm-mig-4-instances-590.48.01-replays9-load.txt",
	"mi300x-spx":             "testdata/captures/amd-smi/mi300x-x8-rocm7.2.1-static.json",
	"mi300x-spx-rocm-smi":    "testdata/captures/rocm-smi/mi300x-x8-concise.txt",
	"mi300x-cpx":             "testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz",
	"mi210-xgmi-pcie":        "testdata/captures/kfd-topology/mi210-x8-xgmi-pcie",
	"rtx2080ti-xid-critical": "testdata/captures/nvidia-bug-report/rtx2080ti-x4-440.31-xid62-xid13-xid31.log",
	"rtx4090x8-mixed-load":   "testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt",
	"rtx4090x8-shared":       "testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt",
}

// sharedGPUs are the GPUs published as fractions, by node.
var sharedGPUs = map[string][]int{"rtx4090x8-shared": {0, 1, 2, 3}}

const nicDriver = "nic.example.com"

var (
	setupOnce sync.Once
	setupErr  error
	results   = map[string]*dra.Result{}
	nicRoots  = map[string]map[string]string{} // node -> NIC device -> pcieRoot
)

func loadRecorded(t testing.TB, p string) *snapshot.Snapshot {
	s, err := source.Load(context.Background(), []string{filepath.Join("..", "..", p)}, discover.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// setup publishes every recorded machine as a node with its slices, a NIC
// driver's slice where the machine has NICs, and the DeviceClasses.
func setup(t testing.TB) {
	t.Helper()
	need(t)
	setupOnce.Do(func() {
		ctx := context.Background()
		c := cp.Client
		for _, dc := range append(dra.DeviceClasses(), nicClass()) {
			if _, err := c.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
				setupErr = fmt.Errorf("device class %s: %w", dc.Name, err)
				return
			}
		}
		for name, p := range recorded {
			s := loadRecorded(t, p)
			r, err := dra.Build(ctx, dra.Input{Snapshot: s, NodeName: name, Shared: sharedGPUs[name]})
			if err != nil {
				setupErr = err
				return
			}
			results[name] = r
			if _, err := AddNode(ctx, c, name); err != nil {
				setupErr = err
				return
			}
			for _, o := range r.Objects() {
				if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &o, metav1.CreateOptions{}); err != nil {
					setupErr = fmt.Errorf("the apiserver refused slice %s of %s: %w", o.Name, name, err)
					return
				}
			}
			if nics, roots := nicSlice(s, name); nics != nil {
				nicRoots[name] = roots
				if _, err := c.ResourceV1().ResourceSlices().Create(ctx, nics, metav1.CreateOptions{}); err != nil {
					setupErr = err
					return
				}
			}
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

func nicClass() resourceapi.DeviceClass {
	return resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: nicDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == '" + nicDriver + "'"}}}},
	}
}

// nicSlice publishes a machine's NICs as a NIC driver that sets the
// standard pcieRoot attribute would.
func nicSlice(s *snapshot.Snapshot, node string) (*resourceapi.ResourceSlice, map[string]string) {
	byAddr := map[string]snapshot.PCIDevice{}
	for _, d := range s.PCI {
		byAddr[d.Address] = d
	}
	roots := map[string]string{}
	var devs []resourceapi.Device
	for _, d := range s.PCI {
		if d.Kind != snapshot.KindNIC {
			continue
		}
		root := d
		for i := 0; root.Parent != "" && i < 32; i++ {
			p, ok := byAddr[root.Parent]
			if !ok {
				break
			}
			root = p
		}
		dom, rest, _ := strings.Cut(root.Address, ":")
		bus, _, _ := strings.Cut(rest, ":")
		pci, r := d.Address, "pci"+dom+":"+bus
		name := dra.DNSLabel("nic-" + d.Address)
		roots[name] = r
		devs = append(devs, resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			dra.AttrPCIBusID: {StringValue: &pci}, dra.AttrPCIeRoot: {StringValue: &r}}})
	}
	if len(devs) == 0 {
		return nil, nil
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-nics"},
		Spec: resourceapi.ResourceSliceSpec{Driver: nicDriver, NodeName: &node, Devices: devs,
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}},
	}, roots
}

var exampleRE = regexp.MustCompile("(?s)<!-- example: ([a-z0-9-]+) -->\\s*```yaml\\n(.*?)```")

func docExample(t *testing.T, name string) *resourceapi.ResourceClaim {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range exampleRE.FindAllStringSubmatch(string(b), -1) {
		if m[1] == name {
			var c resourceapi.ResourceClaim
			if err := yaml.UnmarshalStrict([]byte(m[2]), &c); err != nil {
				t.Fatal(err)
			}
			return &c
		}
	}
	t.Fatalf("no example %s in docs/kubernetes.md", name)
	return nil
}

var seq int
var seqMu sync.Mutex

// schedule creates the claim (renamed uniquely) and a pod using it, pinned
// to node when given, and waits for the real scheduler to bind it; nil when
// it is not bound within wait.
func schedule(t *testing.T, claim *resourceapi.ResourceClaim, node string, wait time.Duration) (*v1.Pod, *resourceapi.ResourceClaim) {
	t.Helper()
	ctx := context.Background()
	seqMu.Lock()
	seq++
	n := seq
	seqMu.Unlock()
	c := claim.DeepCopy()
	c.Name = fmt.Sprintf("%s-%d", claim.Name, n)
	c.Namespace = "default"
	if _, err := cp.Client.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the apiserver refused claim %s: %v", c.Name, err)
	}
	pod := PodFor("pod-"+c.Name, "default", c.Name, node)
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { release(t, pod.Name, c.Name) })
	p, cl, err := WaitBound(ctx, cp.Client, "default", pod.Name, c.Name, wait)
	if err != nil {
		if p != nil {
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodScheduled {
					t.Logf("%s not bound: %s", c.Name, cond.Message)
				}
			}
		}
		return nil, nil
	}
	return p, cl
}

// release deletes a test's pod (there is no kubelet to end it) and its
// claim, and waits until the claim is gone and its devices are free again.
func release(t *testing.T, pod, claim string) {
	ctx := context.Background()
	zero := int64(0)
	_ = cp.Client.CoreV1().Pods("default").Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	_ = cp.Client.ResourceV1().ResourceClaims("default").Delete(ctx, claim, metav1.DeleteOptions{})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, claim, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("claim %s still there 30 s after its pod was deleted", claim)
}

func devicesOf(cl *resourceapi.ResourceClaim, driver string) []string {
	var out []string
	for _, r := range cl.Status.Allocation.Devices.Results {
		if r.Driver == driver {
			out = append(out, r.Device)
		}
	}
	return out
}

func device(t *testing.T, node, name string) resourceapi.Device {
	t.Helper()
	for _, d := range results[node].Devices() {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("node %s has no device %s", node, name)
	return resourceapi.Device{}
}

func TestAPIServerAcceptsEverySlice(t *testing.T) {
	setup(t)
	l, err := cp.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, r := range results {
		want += len(r.Slices)
	}
	got := 0
	for _, s := range l.Items {
		if s.Spec.Driver == dra.DriverName {
			got++
			// Nothing the apiserver knows was dropped on the way.
			r := results[*s.Spec.NodeName]
			found := false
			for _, o := range r.Objects() {
				if o.Name == s.Name {
					found = true
					if len(o.Spec.Devices) != len(s.Spec.Devices) || len(o.Spec.SharedCounters) != len(s.Spec.SharedCounters) {
						t.Errorf("%s: stored with %d devices and %d counter sets, sent %d and %d", s.Name, len(s.Spec.Devices), len(s.Spec.SharedCounters), len(o.Spec.Devices), len(o.Spec.SharedCounters))
					}
					for i := range o.Spec.Devices {
						if i < len(s.Spec.Devices) && len(o.Spec.Devices[i].Attributes) != len(s.Spec.Devices[i].Attributes) {
							t.Errorf("%s/%s: attributes dropped", s.Name, o.Spec.Devices[i].Name)
						}
						if i < len(s.Spec.Devices) && len(o.Spec.Devices[i].ConsumesCounters) != len(s.Spec.Devices[i].ConsumesCounters) {
							t.Errorf("%s/%s: counters dropped", s.Name, o.Spec.Devices[i].Name)
						}
						if i < len(s.Spec.Devices) && !reflect.DeepEqual(o.Spec.Devices[i].AllowMultipleAllocations, s.Spec.Devices[i].AllowMultipleAllocations) {
							t.Errorf("%s/%s: allowMultipleAllocations not kept", s.Name, o.Spec.Devices[i].Name)
						}
					}
				}
			}
			if !found {
				t.Errorf("unexpected slice %s", s.Name)
			}
		}
	}
	if got != want {
		t.Errorf("%d slices stored, %d published", got, want)
	}
	t.Logf("%d nodes, %d slices of gpu.kiln.dev accepted by kube-apiserver", len(results), got)
}

// TestAPIServerRefusesWhatValidateRefuses checks kiln's own validation
// against the apiserver on the rules it reimplements.
func TestAPIServerRefusesWhatValidateRefuses(t *testing.T) {
	setup(t)
	str := func(s string) *string { return &s }
	bad := map[string]resourceapi.Device{
		"version 12.4":       {Name: "d", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"v": {VersionValue: str("12.4")}}},
		"version 550.144.03": {Name: "d", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"v": {VersionValue: str("550.144.03")}}},
		"string of 65":       {Name: "d", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"s": {StringValue: str(strings.Repeat("x", 65))}}},
		"identifier of 33":   {Name: "d", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{resourceapi.QualifiedName(strings.Repeat("a", 33)): {StringValue: str("x")}}},
		"name not a label":   {Name: "GPU_0"},
		"taint effect":       {Name: "d", Taints: []resourceapi.DeviceTaint{{Key: "k", Effect: "PreferNoSchedule"}}},
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for i := 0; i < 33; i++ {
		attrs[resourceapi.QualifiedName(fmt.Sprintf("a%d", i))] = resourceapi.DeviceAttribute{StringValue: str("x")}
	}
	bad["33 attributes"] = resourceapi.Device{Name: "d", Attributes: attrs}
	q := func(v string) *resource.Quantity { x := resource.MustParse(v); return &x }
	yes := func() *bool { b := true; return &b }
	policy := func(p resourceapi.CapacityRequestPolicy, multi *bool) resourceapi.Device {
		return resourceapi.Device{Name: "d", AllowMultipleAllocations: multi,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("24Gi"), RequestPolicy: &p}}}
	}
	bad["policy on a device not shared"] = policy(resourceapi.CapacityRequestPolicy{Default: q("1Gi")}, nil)
	// kiln also refuses a default above the capacity, which the apiserver
	// of 1.37 takes (and no claim could ever be given).
	bad["range without a default"] = policy(resourceapi.CapacityRequestPolicy{ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("1Gi")}}, yes())
	bad["default below the range"] = policy(resourceapi.CapacityRequestPolicy{Default: q("1Gi"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("2Gi")}}, yes())
	bad["default off the steps"] = policy(resourceapi.CapacityRequestPolicy{Default: q("1536Mi"),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("1Gi"), Step: q("1Gi")}}, yes())
	bad["values not ascending"] = policy(resourceapi.CapacityRequestPolicy{Default: q("1Gi"), ValidValues: []resource.Quantity{resource.MustParse("2Gi"), resource.MustParse("1Gi")}}, yes())
	node := "hgx-h100-sysfs"
	for why, d := range bad {
		if dra.ValidateDevice(d) == nil {
			t.Errorf("%s: kiln's validation accepts it", why)
		}
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "bad-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "bad.example.com", NodeName: &node, Devices: []resourceapi.Device{d},
				Pool: resourceapi.ResourcePool{Name: "bad", Generation: 1, ResourceSliceCount: 1}},
		}
		_, err := cp.Client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			t.Errorf("%s: the apiserver accepts it (kiln refuses it)", why)
		}
	}
}

func TestSchedulerNVLinkPair(t *testing.T) {
	setup(t)
	claim := docExample(t, "nvlink-pair")
	for i := 0; i < 3; i++ {
		p, cl := schedule(t, claim, "", 30*time.Second)
		if p == nil {
			t.Fatalf("claim %d not bound", i)
		}
		ds := devicesOf(cl, dra.DriverName)
		if len(ds) != 2 {
			t.Fatalf("%v", ds)
		}
		a := device(t, p.Spec.NodeName, ds[0]).Attributes[dra.AttrNVLinkIsland].IntValue
		b := device(t, p.Spec.NodeName, ds[1]).Attributes[dra.AttrNVLinkIsland].IntValue
		if a == nil || b == nil || *a != *b {
			t.Errorf("%s: %v not in one NVLink island", p.Spec.NodeName, ds)
		}
		t.Logf("bound to %s %v", p.Spec.NodeName, ds)
	}
	// Pinned to a node without NVLink: never bound.
	if p, _ := schedule(t, claim, "pcie-l40s-pairs", 3*time.Second); p != nil {
		t.Errorf("bound on a node without NVLink")
	}
}

func TestSchedulerCUDAVersion(t *testing.T) {
	setup(t)
	claim := docExample(t, "cuda-12-4")
	for i := 0; i < 4; i++ {
		p, cl := schedule(t, claim, "", 30*time.Second)
		if p == nil {
			t.Fatal("not bound")
		}
		d := device(t, p.Spec.NodeName, devicesOf(cl, dra.DriverName)[0])
		v := d.Attributes[dra.AttrCUDADriverVersion].VersionValue
		if v == nil {
			t.Errorf("%s/%s has no CUDA version", p.Spec.NodeName, d.Name)
		} else if ok, _ := version.AtLeast(*v, "12.4"); !ok {
			t.Errorf("%s/%s runs CUDA %s", p.Spec.NodeName, d.Name, *v)
		}
	}
	if p, _ := schedule(t, claim, "hgx-h100-sysfs", 3*time.Second); p != nil {
		t.Errorf("bound on a node whose driver runs CUDA 12.2")
	}
}

func TestSchedulerGPUAndNICUnderOneRoot(t *testing.T) {
	setup(t)
	claim := docExample(t, "gpu-nic-same-root")
	for i := 0; i < 3; i++ {
		p, cl := schedule(t, claim, "", 30*time.Second)
		if p == nil {
			t.Fatal("not bound")
		}
		g := device(t, p.Spec.NodeName, devicesOf(cl, dra.DriverName)[0])
		nic := devicesOf(cl, nicDriver)[0]
		if r := g.Attributes[dra.AttrPCIeRoot].StringValue; r == nil || *r != nicRoots[p.Spec.NodeName][nic] {
			t.Errorf("%s: GPU %s under %v, NIC %s under %s", p.Spec.NodeName, g.Name, r, nic, nicRoots[p.Spec.NodeName][nic])
		}
	}
}

func migClaim(profile string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "mig-" + strings.ReplaceAll(strings.ReplaceAll(profile, ".", "-"), "+", "-")},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassMIG, Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: "device.attributes['gpu.kiln.dev'].profile == '" + profile + "'"}}}},
		}}}},
	}
}

func TestSchedulerMIGCountersNeverOverlap(t *testing.T) {
	setup(t)
	node := "mig-h100-no-instances"
	used := map[int64]string{}
	take := func(profile string, wait time.Duration) bool {
		p, cl := schedule(t, migClaim(profile), node, wait)
		if p == nil {
			return false
		}
		d := device(t, node, devicesOf(cl, dra.DriverName)[0])
		st := *d.Attributes[dra.AttrMIGStart].IntValue
		size := map[string]int64{"3g.40gb": 4, "1g.10gb": 1, "2g.20gb": 2}[profile]
		for s := st; s < st+size; s++ {
			if other, ok := used[s]; ok {
				t.Errorf("%s overlaps %s at memory slice %d", d.Name, other, s)
			}
			used[s] = d.Name
		}
		return true
	}
	if !take("3g.40gb", 20*time.Second) || !take("2g.20gb", 20*time.Second) || !take("1g.10gb", 20*time.Second) {
		t.Fatal("3g.40gb, 2g.20gb and 1g.10gb should fit together")
	}
	// 6 of 7 compute slices are used. One 1g.10gb more fits only where a
	// free memory slice is a legal 1g start (slot 7 is not): at most one.
	extra := 0
	for take("1g.10gb", 3*time.Second) {
		extra++
		if extra > 1 {
			t.Fatal("more than seven compute slices handed out")
		}
	}
	t.Logf("%d more 1g.10gb fitted beside 3g.40gb, 2g.20gb and 1g.10gb", extra)
	whole := docExample(t, "mig-or-gpu")
	if p, _ := schedule(t, whole, node, 3*time.Second); p != nil {
		t.Error("mig-or-gpu bound on a full MIG GPU")
	}
	t.Logf("placements used: %v", used)
}

func TestSchedulerNeverUsesTaintedGPU(t *testing.T) {
	setup(t)
	node := "rtx2080ti-xid-critical"
	claim := func(n int64) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpus-%d", n)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU, Count: n}}}}}}
	}
	if p, _ := schedule(t, claim(4), node, 3*time.Second); p != nil {
		t.Error("four GPUs bound; one has a critical Xid")
	}
	p, cl := schedule(t, claim(3), node, 30*time.Second)
	if p == nil {
		t.Fatal("three untainted GPUs not bound")
	}
	for _, d := range devicesOf(cl, dra.DriverName) {
		for _, tn := range device(t, node, d).Taints {
			if tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
				t.Errorf("bound to %s tainted %s", d, tn.Key)
			}
		}
	}
}

// TestClaimFromTemplate has kube-controller-manager make the claim from a
// pod's ResourceClaimTemplate.
func TestClaimFromTemplate(t *testing.T) {
	setup(t)
	ctx := context.Background()
	tpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: "default"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: docExample(t, "healthy").Spec},
	}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name := "one-gpu"
	pod := PodFor("templated", "default", "", "")
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &name}}
	if _, err := cp.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := cp.Client.CoreV1().Pods("default").Get(ctx, "templated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" && len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
			cl, err := cp.Client.ResourceV1().ResourceClaims("default").Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := device(t, p.Spec.NodeName, devicesOf(cl, dra.DriverName)[0])
			if h := *d.Attributes[dra.AttrHealth].StringValue; h != dra.HealthHealthy {
				t.Errorf("templated claim got %s/%s, health %s", p.Spec.NodeName, d.Name, h)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the templated pod was not bound: %+v", p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPluginPreparesWhatTheSchedulerAllocated runs kiln's kubelet plugin
// against the real apiserver: it publishes its node's slices, the real
// scheduler allocates a claim, and the test prepares it over the plugin's
// socket as the kubelet would.
func TestPluginPreparesWhatTheSchedulerAllocated(t *testing.T) {
	setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := "plugin-l40s"
	if _, err := AddNode(ctx, cp.Client, node); err != nil {
		t.Fatal(err)
	}
	s := loadRecorded(t, "testdata/fixtures/pcie4-downtrained-acs")
	root, err := os.MkdirTemp("", "kdra")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	drv, err := plugin.Start(ctx, plugin.Config{
		NodeName: node, KubeClient: cp.Client,
		Load:         func(context.Context) (*snapshot.Snapshot, error) { return s, nil },
		RegistrarDir: filepath.Join(root, "r"), PluginDir: filepath.Join(root, "p"), CDIDir: filepath.Join(root, "c"),
		CDI: cdi.Options{AssumeNodes: true, Root: os.DirFS(root)}, Recheck: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Stop()
	results[node] = drv.Result()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pair"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU, Count: 2}}},
			Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"gpus"}, MatchAttribute: ptr(resourceapi.FullyQualifiedName("gpu.kiln.dev/pcieSwitch"))}},
		}}}
	p, cl := schedule(t, claim, node, 60*time.Second)
	if p == nil {
		t.Fatal("the claim on the plugin's node was not bound (slices not published?)")
	}
	conn, err := grpc.NewClient("unix://"+drv.DRASocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dc := drapb.NewDRAPluginClient(conn)
	resp, err := dc.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "default", Uid: string(cl.UID), Name: cl.Name}}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Claims[string(cl.UID)]
	if r == nil || r.Error != "" || len(r.Devices) != 2 {
		t.Fatalf("prepare: %+v", r)
	}
	spec := filepath.Join(root, "c", "kiln.dev-claim-"+string(cl.UID)+".json")
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devicesOf(cl, dra.DriverName) {
		if !bytes.Contains(b, []byte(string(cl.UID)+"-"+d)) {
			t.Errorf("spec has no device for %s", d)
		}
	}
	uresp, err := dc.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: "default", Uid: string(cl.UID), Name: cl.Name}}})
	if err != nil || uresp.Claims[string(cl.UID)].Error != "" {
		t.Fatalf("unprepare: %v %+v", err, uresp)
	}
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Error("spec still there after unprepare")
	}
	_ = types.UID("")
}

func ptr[T any](v T) *T { return &v }

// TestDeployAcceptedByAPIServer renders deploy/ and has the apiserver
// accept every object (server-side dry run).
func TestDeployAcceptedByAPIServer(t *testing.T) {
	need(t)
	kubectl := kubectlPath(t)
	for dir, kinds := range map[string][]string{
		"deploy":        {"kind: DaemonSet", "kind: ClusterRole", "kind: DeviceClass", "kind: ServiceAccount", "kind: Namespace"},
		"deploy/server": {"kind: StatefulSet", "kind: Service", "kind: ClusterRole", "kind: ServiceAccount"},
	} {
		rendered := kustomize(t, kubectl, dir)
		for _, kind := range kinds {
			if !bytes.Contains(rendered, []byte(kind)) {
				t.Errorf("%s renders no %s", dir, kind)
			}
		}
		out := applyRendered(t, kubectl, rendered, true)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		slices.Sort(lines)
		t.Logf("%s accepted (dry run):\n%s", dir, strings.Join(lines, "\n"))
	}
}

// kubectlPath is the kubectl scripts/kube.sh builds beside the control
// plane, or the one on PATH; the test skips without one.
func kubectlPath(t *testing.T) string {
	t.Helper()
	if dir, err := BinDir(); err == nil {
		if p := filepath.Join(dir, "kubectl"); fileExists(p) {
			return p
		}
	}
	return testenv.Need(t, "kubectl", "scripts/kube.sh builds it beside the control plane; it renders the kustomize bases")
}

// kustomize renders one of the repository's kustomize folders.
func kustomize(t *testing.T, kubectl, dir string) []byte {
	t.Helper()
	rendered, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	return rendered
}

// applyRendered applies rendered objects server-side, for real or as a
// dry run, into kiln-system (made first: a dry run creates nothing).
func applyRendered(t *testing.T, kubectl string, rendered []byte, dryRun bool) []byte {
	t.Helper()
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kiln-system"}}
	if _, err := cp.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig", cp.Kubeconfig, "apply", "--server-side", "-f", "-"}
	if dryRun {
		args = append(args, "--dry-run=server")
	}
	cmd := exec.Command(kubectl, args...)
	cmd.Stdin = bytes.NewReader(rendered)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply (dry run %v): %v\n%s", dryRun, err, out)
	}
	return out
}

// TestSchedulerSharesFractions: the real scheduler puts claims that each
// ask 10 GiB of a shared 24 GiB RTX 4090 two to a GPU, only on the shared
// GPUs, and binds no ninth.
func TestSchedulerSharesFractions(t *testing.T) {
	setup(t)
	node := "rtx4090x8-shared"
	claim := docExample(t, "fraction")
	per := map[string]int{}
	for i := 0; i < 8; i++ {
		_, cl := schedule(t, claim, node, 30*time.Second)
		if cl == nil {
			t.Fatalf("claim %d of 10 GiB not bound; four shared 24 GiB GPUs hold eight", i)
		}
		r := cl.Status.Allocation.Devices.Results
		if len(r) != 1 || r[0].ShareID == nil {
			t.Fatalf("claim %d: %+v, want one share of a device", i, r)
		}
		per[r[0].Device]++
	}
	if want := map[string]int{"gpu-0": 2, "gpu-1": 2, "gpu-2": 2, "gpu-3": 2}; !reflect.DeepEqual(per, want) {
		t.Errorf("claims per GPU %v, want %v", per, want)
	}
	if _, cl := schedule(t, claim, node, 5*time.Second); cl != nil {
		t.Errorf("a ninth 10 GiB claim was bound to %v: the shared GPUs are full", devicesOf(cl, dra.DriverName))
	}
}

// TestConsumableCapacityProbe asks this control plane (the feature on, as
// by default in 1.37) and one started with DRAConsumableCapacity=false
// whether they keep shared devices.
func TestConsumableCapacityProbe(t *testing.T) {
	need(t)
	ctx := context.Background()
	on, err := plugin.ConsumableCapacity(ctx, cp.Client, "hgx-h100-sysfs")
	if err != nil || !on {
		t.Fatalf("default control plane: shares %v, %v; want true", on, err)
	}
	off, err := Start(ctx, t.TempDir(), Options{NoScheduler: true, FeatureGates: "DRAConsumableCapacity=false"})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Stop()
	if _, err := AddNode(ctx, off.Client, "n1"); err != nil {
		t.Fatal(err)
	}
	shares, err := plugin.ConsumableCapacity(ctx, off.Client, "n1")
	if err != nil || shares {
		t.Fatalf("control plane without DRAConsumableCapacity: shares %v, %v; want false", shares, err)
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
