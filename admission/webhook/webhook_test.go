package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/source"
)

// fleet is a mixed cluster: H100s on driver 550 (CUDA 12.4), L40S on 550,
// and RTX 4090s on 535 (CUDA 12.2, no forward compatibility).
var fleet = map[string]string{
	"h100-550":    "testdata/captures/nvidia-smi-summary/h100x8-550.90.07.txt",
	"l40s-550":    "testdata/fixtures/pcie4-downtrained-acs",
	"rtx4090-535": "testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt",
}

func fleetSlices(t *testing.T) []resourceapi.ResourceSlice {
	t.Helper()
	var out []resourceapi.ResourceSlice
	for node, p := range fleet {
		s, err := source.Load(context.Background(), []string{filepath.Join("..", "..", p)}, discover.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := dra.Build(context.Background(), dra.Input{Snapshot: s, NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Objects()...)
	}
	return out
}

// fakeCluster answers from memory.
type fakeCluster struct {
	slices  []resourceapi.ResourceSlice
	pods    map[string]*corev1.Pod
	secrets map[string]DockerConfig // namespace/name
}

// ClaimSpec: the template "nic" asks for another driver's device; every
// other claim asks for a whole kiln GPU.
func (c *fakeCluster) ClaimSpec(_ context.Context, _ string, pc corev1.PodResourceClaim) (*resourceapi.ResourceClaimSpec, error) {
	class := dra.ClassGPU
	if pc.ResourceClaimTemplateName != nil && *pc.ResourceClaimTemplateName == "nic" {
		class = "nic.example.com"
	}
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "d",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}}}, nil
}

func (c *fakeCluster) Slices(context.Context) ([]resourceapi.ResourceSlice, error) {
	return c.slices, nil
}
func (c *fakeCluster) Pod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if p := c.pods[ns+"/"+name]; p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("pod %s/%s not found", ns, name)
}
func (c *fakeCluster) PullSecrets(_ context.Context, ns string, names []string) ([]DockerConfig, error) {
	var out []DockerConfig
	for _, n := range names {
		if d, ok := c.secrets[ns+"/"+n]; ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// counting counts the images read.
type counting struct {
	Images
	n atomic.Int64
}

func (c *counting) Read(ctx context.Context, ref string, creds []DockerConfig) (*compat.Requirements, error) {
	c.n.Add(1)
	return c.Images.Read(ctx, ref, creds)
}

// stuck is a registry that never answers.
type stuck struct{}

func (stuck) Read(ctx context.Context, _ string, _ []DockerConfig) (*compat.Requirements, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func gpuPod(name string, images ...string) *corev1.Pod {
	p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "lab"},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr("gpu")}}}}
	for i, im := range images {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: im})
	}
	return p
}

// review posts an AdmissionReview of obj to the webhook.
func review(t *testing.T, url, kind string, obj runtime.Object, ns string) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	rev := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("uid-" + kind), Kind: metav1.GroupVersionKind{Kind: kind}, Namespace: ns,
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
	body, _ := json.Marshal(rev)
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook answered %s", resp.Status)
	}
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || out.Response.UID != rev.Request.UID {
		t.Fatalf("response %+v does not answer request %s", out.Response, rev.Request.UID)
	}
	return out.Response
}

// TestWebhook runs the webhook over loopback with images in a real
// registry and the slices of a mixed fleet.
func TestWebhook(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	cuda124 := reg.PushSpec(t, "lab/cuda124", imagetest.Spec{CUDA: "12.4.127", Env: map[string]string{"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}})
	cuda130 := reg.PushSpec(t, "lab/cuda130", imagetest.Spec{CUDA: "13.0.48", Env: map[string]string{"CUDA_VERSION": "13.0.0", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}})
	cluster := &fakeCluster{slices: fleetSlices(t), pods: map[string]*corev1.Pod{}}
	images := &counting{Images: &Registry{Insecure: true}}
	srv := httptest.NewServer(Handler(Config{Images: images, Cluster: cluster}))
	defer srv.Close()

	t.Run("image needing CUDA 13 is refused with kiln's reason", func(t *testing.T) {
		r := review(t, srv.URL+PathPods, "Pod", gpuPod("new", cuda130), "lab")
		if r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, "runs on no GPU of this cluster") ||
			!strings.Contains(r.Result.Message, "13.0") || !strings.Contains(r.Result.Message, "fix:") {
			t.Fatalf("answer %+v %+v", r.Allowed, r.Result)
		}
		t.Logf("refusal: %s", r.Result.Message)
	})
	t.Run("image that runs on part of the fleet is allowed and said so", func(t *testing.T) {
		r := review(t, srv.URL+PathPods, "Pod", gpuPod("ok", cuda124), "lab")
		if !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "runs on 12 of the cluster's 20") {
			t.Fatalf("answer %v %v", r.Allowed, r.Warnings)
		}
	})
	t.Run("claim of the pod is kept to the devices that run it", func(t *testing.T) {
		pod := gpuPod("train", cuda124)
		cluster.pods["lab/train"] = pod
		claim := &resourceapi.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: "train-gpu", Namespace: "lab", OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "train", UID: "p"}}},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU}}}}}}
		r := review(t, srv.URL+PathClaims, "ResourceClaim", claim, "lab")
		if !r.Allowed || r.PatchType == nil || len(r.Patch) == 0 {
			t.Fatalf("answer %+v", r)
		}
		var patch []struct {
			Op, Path string
			Value    []resourceapi.DeviceRequest
		}
		if err := json.Unmarshal(r.Patch, &patch); err != nil || len(patch) != 1 || patch[0].Path != "/spec/devices/requests" {
			t.Fatalf("patch %s: %v", r.Patch, err)
		}
		sels := patch[0].Value[0].Exactly.Selectors
		if len(sels) != 1 {
			t.Fatalf("selectors %+v", sels)
		}
		// The selector, compiled and run as the scheduler does, lets
		// through the H100s and L40S on 550 and none of the RTX 4090s.
		got := matching(t, sels[0].CEL.Expression, cluster.slices)
		var want []string
		for _, s := range cluster.slices {
			if *s.Spec.NodeName != "rtx4090-535" {
				for _, d := range s.Spec.Devices {
					want = append(want, *s.Spec.NodeName+"/"+d.Name)
				}
			}
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("selector %q selects %v, want %v", sels[0].CEL.Expression, got, want)
		}
	})
	t.Run("pod without GPU claims is untouched", func(t *testing.T) {
		before := images.n.Load()
		p := gpuPod("cpu", cuda130)
		p.Spec.ResourceClaims = nil
		r := review(t, srv.URL+PathPods, "Pod", p, "lab")
		if !r.Allowed || len(r.Warnings) != 0 || images.n.Load() != before {
			t.Fatalf("answer %v %v, images read %d", r.Allowed, r.Warnings, images.n.Load()-before)
		}
	})
	t.Run("pod whose claims ask for another driver's devices is untouched", func(t *testing.T) {
		before := images.n.Load()
		p := gpuPod("nic", cuda130)
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "nic", ResourceClaimTemplateName: ptr("nic")}}
		r := review(t, srv.URL+PathPods, "Pod", p, "lab")
		if !r.Allowed || len(r.Warnings) != 0 || images.n.Load() != before {
			t.Fatalf("answer %v %v, images read %d", r.Allowed, r.Warnings, images.n.Load()-before)
		}
	})
	t.Run("system namespaces are skipped", func(t *testing.T) {
		r := review(t, srv.URL+PathPods, "Pod", gpuPod("sys", cuda130), "kube-system")
		if !r.Allowed {
			t.Fatal("a pod in kube-system was refused")
		}
	})
	t.Run("a file of the webhook's machine is not read as an image", func(t *testing.T) {
		r := review(t, srv.URL+PathPods, "Pod", gpuPod("file", "/etc/passwd", "oci:/var/lib"), "lab")
		if !r.Allowed || len(r.Warnings) != 2 || !strings.Contains(r.Warnings[0], "not a registry reference") {
			t.Fatalf("answer %v %v", r.Allowed, r.Warnings)
		}
	})
	t.Run("a GPU whose driver kiln does not know is a warning, not a refusal", func(t *testing.T) {
		// nvidia-smi topo -m gives no driver version and no model.
		s, err := source.Load(context.Background(), []string{"../../testdata/captures/nvidia-smi-topo/a100x8-nv12-17nic-topo-m.txt"}, discover.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := dra.Build(context.Background(), dra.Input{Snapshot: s, NodeName: "topo-only"})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(Handler(Config{Images: images, Cluster: &fakeCluster{slices: r.Objects()}}))
		defer srv.Close()
		a := review(t, srv.URL+PathPods, "Pod", gpuPod("unknown", cuda130), "lab")
		if !a.Allowed || len(a.Warnings) != 1 || !strings.Contains(a.Warnings[0], "kiln cannot tell whether image") || !strings.Contains(a.Warnings[0], "driver version is unknown") {
			t.Fatalf("answer %v %v", a.Allowed, a.Warnings)
		}
	})
	t.Run("an unreachable registry is a warning, not a hang", func(t *testing.T) {
		s := httptest.NewServer(Handler(Config{Images: stuck{}, Cluster: cluster, Timeout: 300 * time.Millisecond}))
		defer s.Close()
		r := review(t, s.URL+PathPods, "Pod", gpuPod("slow", cuda124), "lab")
		if !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "is the registry reachable") {
			t.Fatalf("answer %v %v", r.Allowed, r.Warnings)
		}
	})
}

// matching compiles expr as the scheduler does and returns the devices of
// slices it selects, as node/device.
func matching(t *testing.T, expr string, rs []resourceapi.ResourceSlice) []string {
	t.Helper()
	c := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
	if c.Error != nil {
		t.Fatalf("selector %q does not compile: %v", expr, c.Error)
	}
	var out []string
	for _, s := range rs {
		for _, d := range s.Spec.Devices {
			ok, _, err := c.DeviceMatches(context.Background(), cel.Device{Driver: s.Spec.Driver, Attributes: d.Attributes, Capacity: d.Capacity})
			if err != nil {
				t.Fatalf("%s/%s: %v", *s.Spec.NodeName, d.Name, err)
			}
			if ok {
				out = append(out, *s.Spec.NodeName+"/"+d.Name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// FuzzReview: any body gets an answer (a review or a 4xx), never a panic.
func FuzzReview(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"kind":"Pod"},"operation":"CREATE","namespace":"lab","object":{"spec":{"resourceClaims":[{"name":"g"}],"containers":[{"image":"/etc/passwd"}]}}}}`))
	f.Add([]byte(`{"request":{"uid":"u","kind":{"kind":"ResourceClaim"},"operation":"CREATE","object":{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"p"}]},"spec":{"devices":{"requests":[{"name":"g","exactly":{"deviceClassName":"gpu.kiln.dev"}}]}}}}}`))
	f.Add([]byte(`not json`))
	h := Handler(Config{Images: stuck{}, Cluster: &fakeCluster{}, Timeout: time.Millisecond})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, p := range []string{PathPods, PathClaims} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, p, bytes.NewReader(body)))
			if w.Code != http.StatusOK && (w.Code < 400 || w.Code >= 500) {
				t.Fatalf("%s answered %d", p, w.Code)
			}
		}
	})
}

// TestPullSecrets: an image in a registry that wants credentials is read
// with the Pod's pull secret, and without one it is a warning, not a
// verdict; another namespace's secret is never used.
func TestPullSecrets(t *testing.T) {
	bin := imagetest.NeedRegistry(t)
	reg, err := imagetest.StartRegistryAuth(bin, t.TempDir(), "lab", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	img, err := imagetest.Image(imagetest.Spec{CUDA: "13.9.10", Env: map[string]string{"CUDA_VERSION": "13.9.0", "NVIDIA_REQUIRE_CUDA": "cuda>=13.9"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := imagetest.PushAuth(reg.Host, "private/cuda", "v1", img, &authn.Basic{Username: "lab", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	var dc DockerConfig
	if err := json.Unmarshal([]byte(`{"auths":{"`+reg.Host+`":{"username":"lab","password":"s3cret"}}}`), &dc); err != nil {
		t.Fatal(err)
	}
	cluster := &fakeCluster{slices: fleetSlices(t), secrets: map[string]DockerConfig{"lab/pull": dc, "other/theirs": dc}}
	srv := httptest.NewServer(Handler(Config{Images: &Registry{Insecure: true}, Cluster: cluster}))
	defer srv.Close()

	p := gpuPod("private", ref)
	r := review(t, srv.URL+PathPods, "Pod", p, "lab")
	if !r.Allowed || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "could not read image") {
		t.Fatalf("without a pull secret: %v %v", r.Allowed, r.Warnings)
	}
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "theirs"}}
	if r := review(t, srv.URL+PathPods, "Pod", p, "lab"); !r.Allowed || len(r.Warnings) != 1 {
		t.Fatalf("with another namespace's secret name: %v %v", r.Allowed, r.Warnings)
	}
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}}
	r = review(t, srv.URL+PathPods, "Pod", p, "lab")
	if r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, "13.9") {
		t.Fatalf("with the pull secret the image is read and refused: %v %+v %v", r.Allowed, r.Result, r.Warnings)
	}
}
