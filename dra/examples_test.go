package dra_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/version"
)

// nicDriver stands for a NIC driver that publishes the standard pcieRoot
// attribute, as the examples' GPU-and-NIC claim expects.
const nicDriver = "nic.example.com"

var exampleRE = regexp.MustCompile("(?s)<!-- example: ([a-z0-9-]+) -->\\s*```yaml\\n(.*?)```")

// docExamples reads the ResourceClaims of docs/kubernetes.md by name.
func docExamples(t *testing.T) map[string]*resourceapi.ResourceClaim {
	t.Helper()
	b, err := os.ReadFile(repoPath("docs/kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*resourceapi.ResourceClaim{}
	for _, m := range exampleRE.FindAllStringSubmatch(string(b), -1) {
		var c resourceapi.ResourceClaim
		if err := yaml.UnmarshalStrict([]byte(m[2]), &c); err != nil {
			t.Fatalf("example %s: %v", m[1], err)
		}
		c.Namespace = "default"
		c.UID = types.UID("uid-" + m[1])
		out[m[1]] = &c
	}
	return out
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }
func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

func classes() classLister {
	var out classLister
	for _, c := range dra.DeviceClasses() {
		out = append(out, &c)
	}
	out = append(out, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: nicDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == '" + nicDriver + "'"}}}},
	})
	return out
}

// cluster is one recorded node's slices with an allocator over them.
type cluster struct {
	t         *testing.T
	node      string
	slices    []*resourceapi.ResourceSlice
	devices   map[string]resourceapi.Device // by name, kiln's only
	allocated sets.Set[structured.DeviceID]
	shared    sets.Set[structured.SharedDeviceID]
	consumed  structured.ConsumedCapacityCollection
	cache     *cel.Cache
}

func newCluster(t *testing.T, name string) *cluster {
	t.Helper()
	m := machineByName(t, name)
	s := loadMachine(t, m)
	r, err := dra.Build(context.Background(), dra.Input{Snapshot: s, NodeName: m.name, Shared: m.shared})
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, node: m.name, devices: map[string]resourceapi.Device{}, allocated: sets.New[structured.DeviceID](),
		shared: sets.New[structured.SharedDeviceID](), consumed: structured.NewConsumedCapacityCollection(),
		cache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})}
	for _, o := range r.Objects() {
		c.slices = append(c.slices, &o)
	}
	for _, d := range r.Devices() {
		c.devices[d.Name] = d
	}
	if nics := nicSlice(s, m.name); nics != nil {
		c.slices = append(c.slices, nics)
	}
	return c
}

// nicSlice publishes the snapshot's NICs as a NIC driver would: each with
// its PCI address and PCIe root.
func nicSlice(s *snapshot.Snapshot, node string) *resourceapi.ResourceSlice {
	byAddr := map[string]snapshot.PCIDevice{}
	for _, d := range s.PCI {
		byAddr[d.Address] = d
	}
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
		pci, rootAttr := d.Address, "pci"+dom+":"+bus
		devs = append(devs, resourceapi.Device{
			Name: dra.DNSLabel("nic-" + d.Address),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				dra.AttrPCIBusID: {StringValue: &pci},
				dra.AttrPCIeRoot: {StringValue: &rootAttr},
			},
		})
	}
	if len(devs) == 0 {
		return nil
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-nics"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   nicDriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: &node,
			Devices:  devs,
		},
	}
}

var features = structured.Features{DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true, ConsumableCapacity: true}

// allocate runs the scheduler's allocator for one claim on the node; nil
// when the claim cannot be allocated. With keep, the devices stay
// allocated for the next claims.
func (c *cluster) allocate(claim *resourceapi.ResourceClaim, keep bool) []resourceapi.DeviceRequestAllocationResult {
	c.t.Helper()
	ctx := context.Background()
	claim = withDefaults(claim)
	a, err := structured.NewAllocator(ctx, features, structured.AllocatedState{AllocatedDevices: c.allocated, AllocatedSharedDeviceIDs: c.shared, AggregatedCapacity: c.consumed}, classes(), c.slices, c.cache)
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := a.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.node}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		c.t.Fatalf("%s on %s: %v", claim.Name, c.node, err)
	}
	if len(res) == 0 {
		return nil
	}
	if keep {
		for _, r := range res[0].Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				c.allocated.Insert(id)
				continue
			}
			// A share of a device others may share too: the scheduler
			// counts what each share consumed.
			c.shared.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			c.consumed.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return res[0].Devices.Results
}

func (c *cluster) attr(device, name string) resourceapi.DeviceAttribute {
	return c.devices[device].Attributes[resourceapi.QualifiedName(name)]
}

func (c *cluster) str(device, name string) string {
	if v := c.attr(device, name).StringValue; v != nil {
		return *v
	}
	return ""
}

// withDefaults sets what the apiserver defaults in a claim it stores: the
// allocation mode ExactCount and a count of one.
func withDefaults(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c := claim.DeepCopy()
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if e := r.Exactly; e != nil && e.AllocationMode == "" {
			e.AllocationMode, e.Count = resourceapi.DeviceAllocationModeExactCount, max(e.Count, 1)
		}
		for j := range r.FirstAvailable {
			sr := &r.FirstAvailable[j]
			if sr.AllocationMode == "" {
				sr.AllocationMode, sr.Count = resourceapi.DeviceAllocationModeExactCount, max(sr.Count, 1)
			}
		}
	}
	return c
}

// allMode is a copy of a one-request claim that asks for every matching
// device: the allocator then returns exactly the set its selectors select.
func allMode(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c := claim.DeepCopy()
	c.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	c.Spec.Devices.Requests[0].Exactly.Count = 0
	return c
}

func names(rs []resourceapi.DeviceRequestAllocationResult) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Device)
	}
	slices.Sort(out)
	return out
}

// expect returns kiln's devices that pass keep, sorted.
func (c *cluster) expect(keep func(name string) bool) []string {
	var out []string
	for n := range c.devices {
		if keep(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func TestExamplesAreAllTested(t *testing.T) {
	ex := docExamples(t)
	want := []string{"cuda-12-4", "fraction", "gpu-nic-same-root", "healthy", "mig-or-gpu", "nvlink-pair"}
	var got []string
	for n := range ex {
		got = append(got, n)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("docs/kubernetes.md has examples %v, the tests cover %v", got, want)
	}
}

func TestExampleNVLinkPair(t *testing.T) {
	claim := docExamples(t)["nvlink-pair"]
	for _, node := range []string{"hgx-h100-sysfs", "hgx-a100-topo"} {
		c := newCluster(t, node)
		got := c.allocate(claim, false)
		if len(got) != 2 {
			t.Fatalf("%s: %v, want two GPUs", node, names(got))
		}
		a, b := c.attr(got[0].Device, dra.AttrNVLinkIsland).IntValue, c.attr(got[1].Device, dra.AttrNVLinkIsland).IntValue
		if a == nil || b == nil || *a != *b {
			t.Errorf("%s: %v are not in one island", node, names(got))
		}
	}
	// GPUs without NVLink between them never satisfy it.
	for _, node := range []string{"pcie-l40s-pairs", "pcie-rtx4090-two-roots", "mi300x-spx"} {
		if got := newCluster(t, node).allocate(claim, false); got != nil {
			t.Errorf("%s: allocated %v without an NVLink island", node, names(got))
		}
	}
}

func TestExampleCUDA124(t *testing.T) {
	claim := allMode(docExamples(t)["cuda-12-4"])
	for _, node := range []string{"pcie-l40s-pairs", "mig-h100-no-instances", "hgx-h100-sysfs", "mi300x-spx", "rtx4090x8-mixed-load"} {
		c := newCluster(t, node)
		want := c.expect(func(n string) bool {
			v := c.attr(n, dra.AttrCUDADriverVersion).VersionValue
			return c.str(n, dra.AttrType) == dra.TypeGPU && v != nil && atLeast(*v, "12.4.0")
		})
		got := names(c.allocate(claim, false))
		if !slices.Equal(got, want) {
			t.Errorf("%s: selected %v, want %v", node, got, want)
		}
		t.Logf("%s: %d GPUs run CUDA 12.4 or newer", node, len(want))
	}
}

// atLeast: the driver's CUDA version is known and at least floor.
func atLeast(have, floor string) bool {
	ok, _ := version.AtLeast(have, floor)
	return ok
}

func TestExampleGPUNICSameRoot(t *testing.T) {
	claim := docExamples(t)["gpu-nic-same-root"]
	for _, node := range []string{"pcie-l40s-pairs", "hgx-h100-sysfs"} {
		c := newCluster(t, node)
		got := c.allocate(claim, false)
		if len(got) != 2 {
			t.Fatalf("%s: %v, want a GPU and a NIC", node, names(got))
		}
		var gpuRoot, nicRoot string
		for _, r := range got {
			switch r.Driver {
			case dra.DriverName:
				gpuRoot = c.str(r.Device, dra.AttrPCIeRoot)
			case nicDriver:
				for _, s := range c.slices {
					for _, d := range s.Spec.Devices {
						if s.Spec.Driver == nicDriver && d.Name == r.Device {
							nicRoot = *d.Attributes[dra.AttrPCIeRoot].StringValue
						}
					}
				}
			}
		}
		if gpuRoot == "" || gpuRoot != nicRoot {
			t.Errorf("%s: GPU under %q, NIC under %q", node, gpuRoot, nicRoot)
		}
	}
	// Without the PCIe tree kiln does not know the root: no match.
	if got := newCluster(t, "hgx-h100-smi").allocate(claim, false); got != nil {
		t.Errorf("hgx-h100-smi: allocated %v with no PCIe root known", names(got))
	}
}

func TestExampleMIGOrGPU(t *testing.T) {
	claim := docExamples(t)["mig-or-gpu"]
	c := newCluster(t, "mig-h100-no-instances")
	starts := map[int64]bool{}
	for i := 0; i < 7; i++ {
		got := c.allocate(claim, true)
		if len(got) != 1 || got[0].Request != "gpu/mig" || c.str(got[0].Device, dra.AttrProfile) != "1g.10gb" {
			t.Fatalf("claim %d: %+v, want a 1g.10gb MIG device", i, got)
		}
		st := *c.attr(got[0].Device, dra.AttrMIGStart).IntValue
		if starts[st] {
			t.Fatalf("claim %d: placement %d given twice", i, st)
		}
		starts[st] = true
	}
	// Seven 1g.10gb devices use every compute slice: nothing is left, not
	// even the whole GPU (it shares the counters).
	if got := c.allocate(claim, true); got != nil {
		t.Errorf("an eighth claim got %v", names(got))
	}
	// No 1g.10gb device on a GPU whose instances are 1g.20gb: the whole GPU.
	for _, node := range []string{"mig-a100-instances", "pcie-l40s-pairs"} {
		got := newCluster(t, node).allocate(claim, false)
		if len(got) != 1 || got[0].Request != "gpu/whole" {
			t.Errorf("%s: %+v, want the whole GPU", node, got)
		}
	}
}

// TestMIGCountersNeverOverlap fills a MIG GPU with the larger profiles and
// checks that nothing overlapping is handed out beside them.
func TestMIGCountersNeverOverlap(t *testing.T) {
	profile := func(p string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "mig-" + p, Namespace: "default", UID: types.UID("uid-" + p)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "mig",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassMIG, Selectors: []resourceapi.DeviceSelector{{
					CEL: &resourceapi.CELDeviceSelector{Expression: "device.attributes['gpu.kiln.dev'].profile == '" + p + "'"}}}},
			}}}},
		}
	}
	whole := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "whole", Namespace: "default", UID: "uid-whole"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU}}}}},
	}
	c := newCluster(t, "mig-h100-no-instances")
	var got []int64
	for i := 0; i < 2; i++ {
		r := c.allocate(profile("3g.40gb"), true)
		if len(r) != 1 {
			t.Fatalf("3g.40gb number %d not allocated", i+1)
		}
		got = append(got, *c.attr(r[0].Device, dra.AttrMIGStart).IntValue)
	}
	slices.Sort(got)
	if !slices.Equal(got, []int64{0, 4}) {
		t.Errorf("3g.40gb starts %v, want 0 and 4", got)
	}
	for _, p := range []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} {
		if r := c.allocate(profile(p), false); r != nil {
			t.Errorf("%s allocated beside two 3g.40gb: %v", p, names(r))
		}
	}
	if r := c.allocate(whole, false); r != nil {
		t.Errorf("the whole GPU allocated beside two 3g.40gb: %v", names(r))
	}

	// The other way round: the whole GPU taken, no MIG device fits.
	c = newCluster(t, "mig-h100-no-instances")
	if r := c.allocate(whole, true); len(r) != 1 {
		t.Fatal("the whole GPU was not allocated")
	}
	if r := c.allocate(profile("1g.10gb"), false); r != nil {
		t.Errorf("1g.10gb allocated on a GPU given whole: %v", names(r))
	}

	// One media-extension device at most.
	c = newCluster(t, "mig-h100-no-instances")
	if r := c.allocate(profile("1g.10gb+me"), true); len(r) != 1 {
		t.Fatal("1g.10gb+me not allocated")
	}
	if r := c.allocate(profile("1g.10gb+me"), false); r != nil {
		t.Errorf("a second 1g.10gb+me: %v", names(r))
	}
}

func TestExampleHealthy(t *testing.T) {
	claim := allMode(docExamples(t)["healthy"])
	for _, node := range []string{"hgx-h100-sysfs", "mig-a100-instances", "mi300x-spx", "pcie-rtx4090-two-roots"} {
		c := newCluster(t, node)
		want := c.expect(func(n string) bool {
			return c.str(n, dra.AttrType) == dra.TypeGPU && c.str(n, dra.AttrHealth) == dra.HealthHealthy
		})
		if len(want) == 0 {
			t.Fatalf("%s: no healthy GPU to test with", node)
		}
		got := names(c.allocate(claim, false))
		if !slices.Equal(got, want) {
			t.Errorf("%s: selected %v, want %v", node, got, want)
		}
	}
}

// TestTaintedNeverAllocated checks that a GPU with a critical finding is
// not handed out, and that informational taints do not block.
func TestTaintedNeverAllocated(t *testing.T) {
	c := newCluster(t, "rtx2080ti-xid-critical")
	var tainted []string
	for n, d := range c.devices {
		for _, tn := range d.Taints {
			if tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
				tainted = append(tainted, n)
			}
		}
	}
	if len(tainted) != 1 {
		t.Fatalf("NoSchedule taints on %v, want one GPU (the Xid 62 one)", tainted)
	}
	claim := func(n int64) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: "default", UID: "uid-gpus"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU, Count: n}}}}},
		}
	}
	if r := c.allocate(claim(4), false); r != nil {
		t.Errorf("four GPUs allocated, one of them tainted NoSchedule: %v", names(r))
	}
	r := c.allocate(claim(3), false)
	if len(r) != 3 || slices.Contains(names(r), tainted[0]) {
		t.Errorf("three GPUs: %v, want the three untainted", names(r))
	}
}

// TestExampleFraction shares GPUs among claims that each ask for part of
// the memory: two 10 GiB claims fit a 24 GiB RTX 4090, a third does not;
// only the shared GPUs are used, and never beyond their memory.
func TestExampleFraction(t *testing.T) {
	claim := docExamples(t)["fraction"]
	c := newCluster(t, "rtx4090x8-shared")
	shared := c.expect(func(n string) bool { return c.str(n, dra.AttrType) == dra.TypeFraction })
	if !slices.Equal(shared, []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}) {
		t.Fatalf("fraction devices %v, want gpu-0 to gpu-3", shared)
	}
	per := map[string]int{}
	for i := 0; ; i++ {
		cl := claim.DeepCopy()
		cl.Name, cl.UID = fmt.Sprintf("fraction-%d", i), types.UID(fmt.Sprintf("uid-fraction-%d", i))
		res := c.allocate(cl, true)
		if res == nil {
			break
		}
		if len(res) != 1 || res[0].ShareID == nil {
			t.Fatalf("claim %d: %+v, want one shared device", i, res)
		}
		if got := res[0].ConsumedCapacity[dra.CapMemory]; got.Cmp(resource.MustParse("10Gi")) != 0 {
			t.Errorf("claim %d consumed %s of memory, want 10Gi", i, got.String())
		}
		per[res[0].Device]++
		if i > 16 {
			t.Fatal("more 10 GiB claims fit than four 24 GiB GPUs hold")
		}
	}
	want := map[string]int{"gpu-0": 2, "gpu-1": 2, "gpu-2": 2, "gpu-3": 2}
	if !maps.Equal(per, want) {
		t.Errorf("claims per GPU %v, want two on each shared GPU (24 GiB each)", per)
	}
	// The whole-GPU class never takes a shared GPU.
	whole := names(c.allocate(allMode(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "whole", Namespace: "default", UID: "uid-whole"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU}}}}}}), false))
	if !slices.Equal(whole, []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}) {
		t.Errorf("whole GPUs %v, want gpu-4 to gpu-7", whole)
	}
}

// TestFractionWithoutAmountTakesTheGPU: a claim of the fraction class that
// asks no memory takes all of it, so nobody shares that GPU with it.
func TestFractionWithoutAmountTakesTheGPU(t *testing.T) {
	c := newCluster(t, "rtx4090x8-shared")
	plain := docExamples(t)["fraction"].DeepCopy()
	plain.Name, plain.UID = "plain", "uid-plain"
	plain.Spec.Devices.Requests[0].Exactly.Capacity = nil
	first := c.allocate(plain, true)
	if len(first) != 1 {
		t.Fatalf("plain claim: %+v", first)
	}
	for i := 0; i < 6; i++ {
		cl := docExamples(t)["fraction"].DeepCopy()
		cl.Name, cl.UID = fmt.Sprintf("f%d", i), types.UID(fmt.Sprintf("uid-f%d", i))
		res := c.allocate(cl, true)
		if res == nil {
			t.Fatalf("claim %d found no room: three shared GPUs hold six", i)
		}
		if res[0].Device == first[0].Device {
			t.Fatalf("claim %d shares %s with a claim that asked for all of it", i, first[0].Device)
		}
	}
}
