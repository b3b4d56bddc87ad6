package kube

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/executor"
)

// TestStartWaitStop: a job becomes a claim pinned to its GPUs and a Pod on
// the node with the job's image, command and environment and no token;
// the Pod's end is the job's exit; a stopped job's Pod is deleted.
func TestStartWaitStop(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	e := &Executor{Client: c, Node: "n1", Poll: 10 * time.Millisecond}
	job := executor.Job{ID: "J-1", LeaseID: "l-1", Image: "reg/img:1", Command: []string{"train", "--fast"},
		Env:     map[string]string{"KILN_PROJECT": "vision", "A": "1"},
		Devices: []executor.Device{{Index: 0, UUID: "GPU-aaa"}, {Index: 3, PCIAddress: "0000:1b:00.0"}}}
	h, err := e.Start(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.ResourceV1().ResourceClaims("kiln-vision").Get(ctx, "kiln-j-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := claim.Spec.Devices.Requests
	if len(reqs) != 2 || !strings.Contains(reqs[0].Exactly.Selectors[0].CEL.Expression, `"GPU-aaa"`) ||
		!strings.Contains(reqs[1].Exactly.Selectors[0].CEL.Expression, `pciBusID == "0000:1b:00.0"`) {
		t.Fatalf("claim requests %+v", reqs)
	}
	pod, err := c.CoreV1().Pods("kiln-vision").Get(ctx, "kiln-j-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ct := pod.Spec.Containers[0]
	if ct.Image != "reg/img:1" || strings.Join(ct.Command, " ") != "train --fast" || pod.Spec.NodeSelector["kubernetes.io/hostname"] != "n1" ||
		pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken || len(ct.Env) != 2 {
		t.Fatalf("pod %+v", pod.Spec)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 7}}}}
	if _, err := c.CoreV1().Pods("kiln-vision").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	x, err := h.Wait(ctx)
	if err != nil || x.Code != 7 {
		t.Fatalf("exit %+v %v, want code 7", x, err)
	}
	if _, err := c.ResourceV1().ResourceClaims("kiln-vision").Get(ctx, "kiln-j-1", metav1.GetOptions{}); err == nil {
		t.Error("the claim outlived its job")
	}

	job.ID = "j-2"
	h, err = e.Start(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if x, err := h.Wait(ctx); err != nil || x.Reason != "killed" {
		t.Fatalf("stopped job ended %+v %v", x, err)
	}
}

func TestRefusals(t *testing.T) {
	e := &Executor{Client: fake.NewClientset(), Node: "n1"}
	for name, job := range map[string]executor.Job{
		"no image":        {ID: "j", Command: []string{"x"}},
		"bad project":     {ID: "j", Image: "i", Env: map[string]string{"KILN_PROJECT": "Not_A_Label"}},
		"unpinnable gpu":  {ID: "j", Image: "i", Devices: []executor.Device{{Index: 1}}},
		"bad object name": {ID: "j/../x", Image: "i"},
	} {
		if _, err := e.Start(context.Background(), job); err == nil {
			t.Errorf("%s: started", name)
		}
	}
	if got := labelValue(strings.Repeat("a/", 40)); len(got) > 63 || strings.Contains(got, "/") {
		t.Errorf("label value %q", got)
	}
}

// TestContainerStarted: a Pod's log is read only once its job container
// runs or ran (the apiserver answers an unbound Pod's log with nothing,
// which would end the job's log before it starts).
func TestContainerStarted(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, c := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"unbound", corev1.Pod{}, false},
		{"bound, no status", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}}, false},
		{"waiting", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: jobContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}}, false},
		{"another container runs", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "sidecar", State: running}}}}, false},
		{"running", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: jobContainer, State: running}}}}, true},
		{"ended", corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: jobContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}}}, true},
	} {
		if got := containerStarted(&c.pod); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSchedulerPicks: a job whose devices the scheduler picks gets one
// request for that many devices among those offered; once its claim is
// allocated and its Pod scheduled, the handle gives the positions of the
// devices picked (found through the node's ResourceSlice, by UUID or PCI
// address).
func TestSchedulerPicks(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	e := &Executor{Client: c, Node: "n1", Poll: 10 * time.Millisecond}
	job := executor.Job{ID: "J-2", LeaseID: "l-2", Image: "reg/img:1", Choose: 2, Env: map[string]string{"KILN_PROJECT": "vision"},
		Devices: []executor.Device{{Index: 1, UUID: "GPU-b"}, {Index: 2, UUID: "GPU-c"}, {Index: 3, PCIAddress: "0000:1d:00.0"}}}
	h, err := e.Start(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.ResourceV1().ResourceClaims("kiln-vision").Get(ctx, "kiln-j-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := claim.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly.Count != 2 {
		t.Fatalf("claim requests %+v, want one request for 2 devices", reqs)
	}
	expr := reqs[0].Exactly.Selectors[0].CEL.Expression
	for _, want := range []string{`"GPU-b"`, `"GPU-c"`, `pciBusID == "0000:1d:00.0"`, " || "} {
		if !strings.Contains(expr, want) {
			t.Errorf("selector %s lacks %s", expr, want)
		}
	}
	if p := h.(executor.Picked).Picked(); p != nil {
		t.Fatalf("picked %v before the claim is allocated", p)
	}
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n1-kiln"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: dra.DriverName, Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1}, NodeName: ptr("n1"),
		Devices: []resourceapi.Device{
			{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.AttrUUID: str("GPU-b")}},
			{Name: "gpu-2", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.AttrUUID: str("GPU-c")}},
			{Name: "gpu-3", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{dra.AttrPCIBusID: str("0000:1d:00.0")}},
		}}}
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: dra.DriverName, Pool: "n1", Device: "gpu-3"},
		{Request: "gpus", Driver: dra.DriverName, Pool: "n1", Device: "gpu-1"},
	}}}
	if _, err := c.ResourceV1().ResourceClaims("kiln-vision").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.CoreV1().Pods("kiln-vision").Get(ctx, "kiln-j-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = "n1"
	if _, err := c.CoreV1().Pods("kiln-vision").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	go h.Wait(wctx)
	for h.(executor.Picked).Picked() == nil && wctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if got := h.(executor.Picked).Picked(); !slices.Equal(got, []int{2, 0}) {
		t.Fatalf("picked %v, want positions 2 (the PCI-named GPU) and 0 (GPU-b)", got)
	}
	// A device that was not offered is not taken for one that was.
	if _, err := pickedDevices([]resourceapi.DeviceRequestAllocationResult{{Driver: dra.DriverName, Pool: "n1", Device: "gpu-2"}},
		[]resourceapi.ResourceSlice{*slice}, job.Devices[:1]); err == nil {
		t.Error("a pick of a device not offered was matched")
	}
}

func ptr[T any](v T) *T { return &v }

// TestUnschedulablePodEndsJob: a job whose Pod the scheduler cannot place
// (a claim outside kiln holds its GPU, say) ends after the grace with the
// scheduler's reason, in its exit and its log, and its Pod and claim are
// removed; a Pod merely pending is waited for.
func TestUnschedulablePodEndsJob(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	e := &Executor{Client: c, Node: "n1", Poll: 10 * time.Millisecond, Unschedulable: 100 * time.Millisecond}
	job := executor.Job{ID: "J-3", LeaseID: "l-3", Image: "reg/img:1", Env: map[string]string{"KILN_PROJECT": "vision"},
		Devices: []executor.Device{{Index: 0, UUID: "GPU-a"}}}
	h, err := e.Start(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	logs := h.Logs()
	exits := make(chan executor.Exit, 1)
	go func() {
		x, _ := h.Wait(ctx)
		exits <- x
	}()
	select {
	case x := <-exits:
		t.Fatalf("a pending Pod ended the job: %+v", x)
	case <-time.After(300 * time.Millisecond):
	}
	pod, err := c.CoreV1().Pods("kiln-vision").Get(ctx, "kiln-j-3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const why = "0/14 nodes are available: 1 cannot allocate all claims"
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: why}}
	if _, err := c.CoreV1().Pods("kiln-vision").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var x executor.Exit
	select {
	case x = <-exits:
	case <-time.After(5 * time.Second):
		t.Fatal("the job of an unschedulable Pod did not end")
	}
	if x.Code != -1 || !strings.Contains(x.Reason, "could not be scheduled") || !strings.Contains(x.Reason, why) {
		t.Errorf("exit %+v, want code -1 and the scheduler's reason", x)
	}
	out, _ := io.ReadAll(logs)
	if !strings.Contains(string(out), "never ran") || !strings.Contains(string(out), why) {
		t.Errorf("the job's log %q does not say why it never ran", out)
	}
	if _, err := c.CoreV1().Pods("kiln-vision").Get(ctx, "kiln-j-3", metav1.GetOptions{}); err == nil {
		t.Error("the unschedulable Pod was left")
	}
	if _, err := c.ResourceV1().ResourceClaims("kiln-vision").Get(ctx, "kiln-j-3", metav1.GetOptions{}); err == nil {
		t.Error("the unschedulable Pod's claim was left")
	}
}
