package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
)

const node = "hgx-1"

// machine serves a recorded machine whose events a test can change.
type machine struct {
	mu sync.Mutex
	s  *snapshot.Snapshot
}

func (m *machine) load(ctx context.Context) (*snapshot.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := json.Marshal(m.s)
	if err != nil {
		return nil, err
	}
	var c snapshot.Snapshot
	return &c, json.Unmarshal(b, &c)
}

func (m *machine) setEvents(ev []snapshot.Event) {
	m.mu.Lock()
	m.s.Events = ev
	m.mu.Unlock()
}

func recorded(t *testing.T, p string) *machine {
	t.Helper()
	s, err := source.Load(context.Background(), []string{filepath.Join("..", "..", p)}, discover.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &machine{s: s}
}

// dirs are short folders for the sockets (AF_UNIX paths are limited).
type dirs struct{ reg, plugin, cdi string }

func newDirs(t *testing.T) dirs {
	root, err := os.MkdirTemp("", "kdra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return dirs{filepath.Join(root, "r"), filepath.Join(root, "p"), filepath.Join(root, "c")}
}

// newFake is a fake API that names objects made with generateName, as the
// apiserver does.
func newFake(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	n := 0
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.CreateAction).GetObject().(metav1.Object)
		if o.GetName() == "" && o.GetGenerateName() != "" {
			n++
			o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), n))
		}
		return false, nil, nil
	})
	return c
}

func startPlugin(t *testing.T, ctx context.Context, client *fake.Clientset, m *machine, d dirs) *Driver {
	t.Helper()
	return startPluginRoot(t, ctx, client, m, d, fstest.MapFS{})
}

func startPluginRoot(t *testing.T, ctx context.Context, client *fake.Clientset, m *machine, d dirs, root fstest.MapFS) *Driver {
	t.Helper()
	return startPluginShared(t, ctx, client, m, d, root, "")
}

func startPluginShared(t *testing.T, ctx context.Context, client *fake.Clientset, m *machine, d dirs, root fstest.MapFS, shared string) *Driver {
	t.Helper()
	drv, err := Start(ctx, Config{
		NodeName: node, KubeClient: client, Load: m.load,
		RegistrarDir: d.reg, PluginDir: d.plugin, CDIDir: d.cdi,
		CDI:     cdi.Options{Root: root, AssumeNodes: true},
		Recheck: time.Hour,
		Shared:  shared,
	})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

func dial(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// allocatedClaim is a claim as the scheduler leaves it: allocated to
// devices of the node's pool.
func allocatedClaim(name string, uid types.UID, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices))}}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: dra.DriverName, Pool: node, Device: d})
	}
	return c
}

func TestPluginOverSockets(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	claim := allocatedClaim("train", "uid-train", "gpu-0", "gpu-3")
	client := newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}, claim)
	m := recorded(t, "testdata/fixtures/h100-hgx8-sysfs")
	d := newDirs(t)
	drv := startPlugin(t, ctx, client, m, d)

	// Registration, as the kubelet's plugin watcher asks.
	info, err := registerapi.NewRegistrationClient(dial(t, drv.RegistrationSocket())).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != dra.DriverName || info.Endpoint != drv.DRASocket() {
		t.Fatalf("GetInfo: %+v", info)
	}
	t.Logf("registration: %s %s at %s, versions %v", info.Type, info.Name, info.Endpoint, info.SupportedVersions)

	// The slices reach the API.
	waitFor(t, "the ResourceSlices", func() bool {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Spec.Devices) == 8
	})

	// Prepare over the DRA socket: a CDI spec for the claim, twice the same.
	dc := drapbv1.NewDRAPluginClient(dial(t, drv.DRASocket()))
	req := &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "default", Uid: "uid-train", Name: "train"}}}
	var first []string
	for i := 0; i < 2; i++ {
		resp, err := dc.NodePrepareResources(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		r := resp.Claims["uid-train"]
		if r == nil || r.Error != "" || len(r.Devices) != 2 {
			t.Fatalf("prepare %d: %+v", i, r)
		}
		var ids []string
		for _, dev := range r.Devices {
			ids = append(ids, dev.CdiDeviceIds...)
		}
		if i == 0 {
			first = ids
		} else if !slices.Equal(ids, first) {
			t.Errorf("prepare again gave %v, first %v", ids, first)
		}
	}
	want := []string{"kiln.dev/gpu=uid-train-gpu-0", "kiln.dev/gpu=uid-train-gpu-3"}
	if !slices.Equal(first, want) {
		t.Errorf("CDI devices %v, want %v", first, want)
	}
	specPath := filepath.Join(d.cdi, "kiln.dev-claim-uid-train.json")
	spec := readSpec(t, specPath)
	if len(spec.Devices) != 2 || !hasNode(spec.Devices[0], "/dev/nvidia0") || !hasNode(spec.Devices[1], "/dev/nvidia3") || hasNode(spec.Devices[0], "/dev/nvidia3") {
		t.Errorf("spec devices %+v", spec.Devices)
	}

	// A second claim for a device already prepared is refused.
	other := allocatedClaim("steal", "uid-steal", "gpu-3")
	if _, err := client.ResourceV1().ResourceClaims("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp, err := dc.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "default", Uid: "uid-steal", Name: "steal"}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Claims["uid-steal"]; r == nil || r.Error == "" {
		t.Errorf("gpu-3 prepared for two claims: %+v", r)
	}

	// Health: all healthy, then GPU 3 falls off the bus, then it is back.
	hc := drahealthv1.NewDRAResourceHealthClient(dial(t, drv.DRASocket()))
	stream, err := hc.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h := health(t, stream); len(h) != 8 || h["gpu-3"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("first health report %v", h)
	}
	m.setEvents([]snapshot.Event{{Source: "kmsg", Kind: snapshot.EventFallenOffBus, Device: "0000:5d:00.0",
		Message: "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus."}})
	if err := drv.Recheck(ctx); err != nil {
		t.Fatal(err)
	}
	if h := health(t, stream); h["gpu-3"] != drahealthv1.HealthStatus_UNHEALTHY || h["gpu-1"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("after the GPU fell off the bus: %v", h)
	}
	waitFor(t, "the NoSchedule taint on gpu-3", func() bool { return taintedNoSchedule(t, client, "gpu-3") })
	m.setEvents(nil)
	if err := drv.Recheck(ctx); err != nil {
		t.Fatal(err)
	}
	if h := health(t, stream); h["gpu-3"] != drahealthv1.HealthStatus_HEALTHY {
		t.Fatalf("after the re-check passed: %v", h)
	}
	waitFor(t, "the taint cleared", func() bool { return !taintedNoSchedule(t, client, "gpu-3") })

	// A restarted plugin keeps the checkpoint and unprepares.
	drv.Stop()
	drv = startPlugin(t, ctx, client, m, d)
	defer drv.Stop()
	dc = drapbv1.NewDRAPluginClient(dial(t, drv.DRASocket()))
	ureq := &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "default", Uid: "uid-train", Name: "train"}}}
	for i := 0; i < 2; i++ {
		uresp, err := dc.NodeUnprepareResources(ctx, ureq)
		if err != nil {
			t.Fatal(err)
		}
		if r := uresp.Claims["uid-train"]; r == nil || r.Error != "" {
			t.Fatalf("unprepare %d: %+v", i, r)
		}
	}
	if _, err := os.Stat(specPath); !os.IsNotExist(err) {
		t.Errorf("the claim's CDI spec is still there after unprepare: %v", err)
	}
	ck, err := loadCheckpoint(filepath.Join(d.plugin, checkpointFile))
	if err != nil || len(ck.Claims) != 0 {
		t.Errorf("checkpoint after unprepare: %+v, %v", ck, err)
	}
}

// TestRepublishOnChangeOnly counts the writes to ResourceSlices.
func TestRepublishOnChangeOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	m := recorded(t, "testdata/fixtures/pcie4-downtrained-acs")
	drv := startPlugin(t, ctx, client, m, newDirs(t))
	defer drv.Stop()
	waitFor(t, "the ResourceSlices", func() bool { return writes(client) >= 1 })
	time.Sleep(200 * time.Millisecond)
	before := writes(client)
	for i := 0; i < 3; i++ {
		if err := drv.Recheck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n := writes(client); n != before {
		t.Errorf("%d slice writes after three unchanged re-checks (was %d)", n, before)
	}
}

func writes(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "resourceslices" && (a.GetVerb() == "create" || a.GetVerb() == "update" || a.GetVerb() == "patch") {
			n++
		}
	}
	return n
}

func TestPrepareMIGAndPartitions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A MIG placement with no instance cannot be prepared, and says why.
	claim := allocatedClaim("mig", "uid-mig", "gpu-0-mig-1g-10gb-0")
	client := newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "u"}}, claim)
	drv := startPlugin(t, ctx, client, recorded(t, "testdata/captures/nvidia-smi-q/h100-vm-mig-4-instances-590.48.01-replays9-load.txt"), newDirs(t))
	res, err := drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	drv.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if r := res["uid-mig"]; r.Err == nil {
		t.Errorf("a MIG placement without an instance was prepared: %+v", r)
	} else {
		t.Logf("refused as it should be: %v", r.Err)
	}

	// An AMD partition gets /dev/kfd and its own render node only.
	claim = allocatedClaim("part", "uid-part", "gpu-1-part-2")
	client = newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "u"}}, claim)
	d := newDirs(t)
	cpx := recorded(t, "testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz")
	// The host's KFD topology gives each partition its render node.
	root := fstest.MapFS{}
	for _, g := range cpx.s.GPUs {
		for _, n := range g.KFDNodes {
			root[fmt.Sprintf("sys/class/kfd/kfd/topology/nodes/%d/properties", n)] = &fstest.MapFile{Data: []byte(fmt.Sprintf("drm_render_minor %d\n", 126+n))}
		}
	}
	drv = startPluginRoot(t, ctx, client, cpx, d, root)
	defer drv.Stop()
	res, err = drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil || res["uid-part"].Err != nil {
		t.Fatalf("%v %v", err, res["uid-part"].Err)
	}
	spec := readSpec(t, filepath.Join(d.cdi, "kiln.dev-claim-uid-part.json"))
	var render []string
	for _, n := range spec.Devices[0].ContainerEdits.DeviceNodes {
		if filepath.Dir(n.Path) == "/dev/dri" {
			render = append(render, n.Path)
		}
	}
	// GPU 1's KFD nodes are 10-17: partition 2 is node 12, renderD138.
	if !hasNode(spec.Devices[0], "/dev/kfd") || !slices.Equal(render, []string{"/dev/dri/renderD138"}) {
		t.Errorf("partition device nodes %v (render %v)", spec.Devices[0].ContainerEdits.DeviceNodes, render)
	}
}

func readSpec(t *testing.T, p string) cdispec.Spec {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	// Read as a CDI runtime loads it: version, kind, device names, device
	// nodes, mounts.
	if _, err := cdiapi.ReadSpec(p, 0); err != nil {
		t.Fatal(err)
	}
	return s
}

func hasNode(d cdispec.Device, p string) bool {
	for _, n := range d.ContainerEdits.DeviceNodes {
		if n.Path == p {
			return true
		}
	}
	return false
}

func health(t *testing.T, s drahealthv1.DRAResourceHealth_NodeWatchResourcesClient) map[string]drahealthv1.HealthStatus {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]drahealthv1.HealthStatus{}
	for _, d := range r.Devices {
		out[d.Device.DeviceName] = d.Health
	}
	return out
}

func taintedNoSchedule(t *testing.T, c *fake.Clientset, device string) bool {
	l, err := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			if d.Name != device {
				continue
			}
			for _, tn := range d.Taints {
				if tn.Effect == resourceapi.DeviceTaintEffectNoSchedule {
					return true
				}
			}
		}
	}
	return false
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shareClaim is a claim allocated a share of device, consuming mem.
func shareClaim(name string, uid types.UID, device, shareID, mem string) *resourceapi.ResourceClaim {
	c := allocatedClaim(name, uid, device)
	r := &c.Status.Allocation.Devices.Results[0]
	if shareID != "" {
		id := types.UID(shareID)
		r.ShareID = &id
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{dra.CapMemory: resource.MustParse(mem)}
	}
	return c
}

// TestPrepareShares: claims holding shares of a shared GPU are prepared
// side by side, each told its part of the memory; a claim that wants the
// GPU alone, or a share of a GPU the node does not share, is refused.
func TestPrepareShares(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := shareClaim("a", "uid-a", "gpu-0", "share-a", "10Gi")
	b := shareClaim("b", "uid-b", "gpu-0", "share-b", "8Gi")
	alone := shareClaim("alone", "uid-alone", "gpu-0", "", "")
	notShared := shareClaim("ns", "uid-ns", "gpu-5", "share-ns", "1Gi")
	client := newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "u"}}, a, b, alone, notShared)
	d := newDirs(t)
	drv := startPluginShared(t, ctx, client, recorded(t, "testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"), d, fstest.MapFS{}, "0,1")
	defer drv.Stop()
	for _, dev := range drv.Result().Devices() {
		shared := dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations
		if want := dev.Name == "gpu-0" || dev.Name == "gpu-1"; shared != want {
			t.Errorf("%s: shared %v, want %v", dev.Name, shared, want)
		}
	}
	res, err := drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{a, b})
	if err != nil || res["uid-a"].Err != nil || res["uid-b"].Err != nil {
		t.Fatalf("two shares of one GPU: %v %v %v", err, res["uid-a"].Err, res["uid-b"].Err)
	}
	spec := readSpec(t, filepath.Join(d.cdi, "kiln.dev-claim-uid-a.json"))
	if !slices.Contains(spec.Devices[0].ContainerEdits.Env, "KILN_GPU_MEMORY_BYTES=10737418240") {
		t.Errorf("claim a's container env %v, want its 10 GiB part", spec.Devices[0].ContainerEdits.Env)
	}
	res, err = drv.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{alone, notShared})
	if err != nil {
		t.Fatal(err)
	}
	if res["uid-alone"].Err == nil || !strings.Contains(res["uid-alone"].Err.Error(), "shared with claim") {
		t.Errorf("a claim wanting a shared GPU alone: %v", res["uid-alone"].Err)
	}
	if res["uid-ns"].Err == nil || !strings.Contains(res["uid-ns"].Err.Error(), "does not share it") {
		t.Errorf("a share of a GPU the node does not share: %v", res["uid-ns"].Err)
	}
}

// TestSharedPublishedWholeWithoutTheFeature: an apiserver without
// DRAConsumableCapacity drops allowMultipleAllocations; the plugin sees it
// in its dry run and publishes the GPUs whole instead of shared in name.
func TestSharedPublishedWholeWithoutTheFeature(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := newFake(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "u"}})
	client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].AllowMultipleAllocations = nil
		}
		return false, nil, nil
	})
	drv := startPluginShared(t, ctx, client, recorded(t, "testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"), newDirs(t), fstest.MapFS{}, "all")
	defer drv.Stop()
	for _, dev := range drv.Result().Devices() {
		if dev.AllowMultipleAllocations != nil || dev.Attributes[dra.AttrType].StringValue == nil || *dev.Attributes[dra.AttrType].StringValue != dra.TypeGPU {
			t.Errorf("%s published as shared on a cluster that cannot share", dev.Name)
		}
	}
}
