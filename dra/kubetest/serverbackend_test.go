package kubetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/executor/kube"
)

// TestServerBackendKubernetes runs 'kiln server --backend kubernetes'
// built as users install it (kiln and kiln-dra side by side) against the
// test's control plane, and drives it with the CLI: every recorded node
// that publishes gpu.kiln.dev devices joins by itself; 'kiln run --image'
// makes a ResourceClaim and a Pod that the real scheduler binds on the
// GPUs kiln chose; 'kiln cancel' deletes them. There is no kubelet: the
// test removes the Pod kiln asked to delete, as a kubelet would once the
// container stopped.
func TestServerBackendKubernetes(t *testing.T) {
	setup(t)
	if testing.Short() {
		t.Skip("builds kiln and kiln-dra and starts the server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, bin, data := kilnServerBackend(t, ctx, "kb-", []string{"KILN_TOKEN=kiln_user_secret"})
	cfgPath := filepath.Join(data, "admin-client.json")
	tokenFile := filepath.Join(data, "kubernetes", "join-token")
	if st, err := os.Stat(tokenFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the backend's join token file: %v %v; want mode 0600", st, err)
	}

	kiln := func(args ...string) (string, error) {
		c := exec.Command(filepath.Join(bin, "kiln"), args...)
		c.Env = append(os.Environ(), "KILN_CONFIG="+cfgPath)
		out, err := c.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			t.Logf("kiln %v: %s", args, ee.Stderr)
		}
		return string(out), err
	}
	out, err := kiln("run", "-d", "-o", "json", "--gpus", "2", "--model", "L40S", "--image", "registry.local/train:1", "--", "train")
	if err != nil {
		t.Fatalf("kiln run: %v\n%s", err, out)
	}
	var run struct {
		Lease api.Lease `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil || run.Lease.ID == "" || len(run.Lease.Jobs) != 1 {
		t.Fatalf("kiln run -d -o json printed %q (%v)", out, err)
	}
	l := waitLease(t, admin, run.Lease.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted })
	node := l.Allocations[0].Node
	var granted []string
	for _, d := range l.Allocations[0].Devices {
		granted = append(granted, d.PCIAddress)
	}
	slices.Sort(granted)
	ns, podName := "kb-default", "kiln-"+l.Jobs[0]
	pod, claim := waitPodBound(t, admin, l.Jobs[0], ns, podName)
	if pod.Spec.NodeName != node {
		t.Errorf("the scheduler bound the job's Pod to %s; kiln granted GPUs on %s", pod.Spec.NodeName, node)
	}
	var held []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		held = append(held, *device(t, r.Pool, r.Device).Attributes[dra.AttrPCIBusID].StringValue)
	}
	slices.Sort(held)
	if !slices.Equal(held, granted) {
		t.Errorf("the claim holds GPUs %v; kiln granted %v on %s", held, granted, node)
	}
	for _, e := range pod.Spec.Containers[0].Env {
		if strings.Contains(e.Value, "kiln_user_secret") || strings.Contains(e.Value, "kiln_join_") {
			t.Errorf("the job's Pod carries a kiln secret in %s", e.Name)
		}
	}

	// kiln exec into the job's Pod, through the server's backend with its
	// ServiceAccount's rights (pods/exec); a stand-in kubelet answers.
	useStandInKubelet(t, ctx, node)
	execCmd := exec.Command(filepath.Join(bin, "kiln"), "exec", l.ID, "-i", "--", "sh", "-c", "read x; echo got $x; exit 6")
	execCmd.Env = append(os.Environ(), "KILN_CONFIG="+cfgPath)
	execCmd.Stdin = strings.NewReader("ok\n")
	var execErr bytes.Buffer
	execCmd.Stderr = &execErr
	execOut, _ := execCmd.Output()
	if code := execCmd.ProcessState.ExitCode(); code != 6 || string(execOut) != "got ok\n" {
		t.Errorf("kiln exec into the job's Pod: exit %d, output %q, want 6 and \"got ok\"\n%s", code, execOut, execErr.String())
	}

	// kiln cancel deletes the Pod; the test removes it as a kubelet would
	// once its container stopped.
	cancelLease := func(id, podName string) {
		t.Helper()
		if out, err := kiln("cancel", id); err != nil {
			t.Fatalf("kiln cancel: %v\n%s", err, out)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if err == nil && p.DeletionTimestamp != nil {
				zero := int64(0)
				if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, podName, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
					t.Fatal(err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kiln cancel did not delete the lease's Pod: %+v %v", p, err)
			}
		}
		waitGone(t, ns, podName, false)
		waitLease(t, admin, id, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	}
	cancelLease(l.ID, podName)
	if out, err := kiln("ls", "--all", "-o", "json"); err != nil || !strings.Contains(out, l.ID) {
		t.Errorf("kiln ls after the lease ended: %v\n%s", err, out)
	}

	// The kube-scheduler picks (placement scheduler). A claim outside kiln
	// holds one GPU of the node, which kiln does not know. A lease for all
	// the node's other GPUs is offered every GPU kiln sees free there, and
	// the real scheduler can only pick the others; kiln then holds those it
	// picked and gives back the rest. Pinned by kiln instead, the lease
	// could land on the foreign claim's GPU and its Pod would never run.
	var whole []api.Device
	nodes, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, d := range n.Devices {
			if n.ID == node && d.Parent == "" && !d.MIGMode {
				whole = append(whole, d)
			}
		}
	}
	if len(whole) < 2 {
		t.Fatalf("node %s has %d whole GPUs; the test needs 2 or more", node, len(whole))
	}
	foreign := whole[0]
	fc := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "foreign"}}
	fc.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: dra.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.attributes['resource.kubernetes.io'].pciBusID == %q", foreign.PCIAddress)}}},
	}}}
	if p, _ := schedule(t, fc, node, 30*time.Second); p == nil {
		t.Fatalf("the foreign claim on %s:%s was not allocated", node, foreign.ID)
	}
	want := len(whole) - 1
	out, err = kiln("run", "-d", "-o", "json", "--gpus", fmt.Sprint(want), "--node", node, "--placement", "scheduler",
		"--image", "registry.local/train:1", "--", "train")
	if err != nil {
		t.Fatalf("kiln run --placement scheduler: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil || run.Lease.ID == "" || len(run.Lease.Jobs) != 1 {
		t.Fatalf("kiln run -d -o json printed %q (%v)", out, err)
	}
	// Granted with every free GPU offered, then the pick.
	l = waitLease(t, admin, run.Lease.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted })
	if a := l.Allocations[0]; a.Choose != 0 && (a.Choose != want || len(a.Devices) != len(whole)) {
		t.Errorf("offered %d GPUs to pick %d; want all %d of %s to pick %d", len(a.Devices), a.Choose, len(whole), node, want)
	}
	podName = "kiln-" + l.Jobs[0]
	_, claim = waitPodBound(t, admin, l.Jobs[0], ns, podName)
	held = held[:0]
	for _, r := range claim.Status.Allocation.Devices.Results {
		held = append(held, *device(t, r.Pool, r.Device).Attributes[dra.AttrPCIBusID].StringValue)
	}
	slices.Sort(held)
	if slices.Contains(held, foreign.PCIAddress) || len(held) != want {
		t.Fatalf("the scheduler allocated %v; want %d GPUs without the foreign claim's %s", held, want, foreign.PCIAddress)
	}
	for deadline := time.Now().Add(60 * time.Second); l.Allocations[0].Choose != 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kiln still holds %d GPUs for the scheduler to pick from, 60 s after it picked %v", len(l.Allocations[0].Devices), held)
		}
		if l, err = admin.GetLease(ctx, l.ID, api.LeaseWait{}); err != nil {
			t.Fatal(err)
		}
	}
	granted = granted[:0]
	for _, d := range l.Allocations[0].Devices {
		granted = append(granted, d.PCIAddress)
	}
	slices.Sort(granted)
	if !slices.Equal(granted, held) {
		t.Errorf("kiln's lease holds %v; the scheduler allocated %v", granted, held)
	}
	nodes, err = admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, d := range n.Devices {
			if n.ID == node && d.ID == foreign.ID && len(d.Leases) != 0 {
				t.Errorf("kiln still counts %s:%s held by %v after the scheduler picked the others", node, d.ID, d.Leases)
			}
		}
	}
	cancelLease(l.ID, podName)

	// Pinned by kiln to every GPU of the node, the foreign one among them:
	// the Pod cannot be scheduled, and after --kube-unschedulable (15 s
	// here) the job ends with the scheduler's reason, and so does its
	// lease, instead of showing running while nothing runs.
	out, err = kiln("run", "-d", "-o", "json", "--gpus", fmt.Sprint(len(whole)), "--node", node, "--image", "registry.local/train:1", "--", "train")
	if err != nil {
		t.Fatalf("kiln run on every GPU of %s: %v\n%s", node, err, out)
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil || len(run.Lease.Jobs) != 1 {
		t.Fatalf("kiln run -d -o json printed %q (%v)", out, err)
	}
	l = waitLeaseFor(t, admin, run.Lease.ID, 90*time.Second)
	j, err := admin.GetJob(ctx, l.Jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.Reason, "could not be scheduled") || !strings.Contains(j.Reason, "cannot allocate all claims") {
		t.Errorf("the job of an unschedulable Pod ended %s: %q; want the scheduler's reason", j.State, j.Reason)
	}
	waitGone(t, ns, "kiln-"+l.Jobs[0], false)
}

// kilnServerBackend builds kiln and kiln-dra, and starts 'kiln server
// --backend kubernetes' (jobs in namespaces prefix+PROJECT) as
// deploy/server's ServiceAccount, with env added to its environment; it
// returns the admin's client, the binaries' folder and the server's data
// folder once every GPU node of the cluster is a ready kiln node.
func kilnServerBackend(t *testing.T, ctx context.Context, prefix string, env []string) (*api.Client, string, string) {
	t.Helper()
	bin := buildBinaries(t, "kiln", "kiln-dra")
	// The backend runs as deploy/server's service account, so that the
	// RBAC it ships is the RBAC the test needs.
	applyRendered(t, kubectlPath(t), kustomize(t, kubectlPath(t), "deploy/server"), false)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: kiln-server
  user: {token: %q, as: "system:serviceaccount:kiln-system:kiln-server"}
contexts:
- name: local
  context: {cluster: local, user: kiln-server}
current-context: local
`, cp.Config.Host, cp.Config.BearerToken)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	// A user's token in the server's environment is not the backend's to
	// have.
	admin, _, data := startServer(t, ctx, bin, env,
		"--backend", "kubernetes", "--kubeconfig", kubeconfig, "--namespace-prefix", prefix, "--kube-watch", "1s", "--kube-unschedulable", "15s")

	// Every recorded node publishing kiln's devices joins, at the pace of
	// the server's limit on requests without credentials.
	want, err := kube.GPUNodes(ctx, cp.Client)
	if err != nil || len(want) < 2 {
		t.Fatalf("GPU nodes of the cluster: %v %v", want, err)
	}
	slices.Sort(want)
	var got []string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		nodes, err := admin.Nodes(ctx)
		got = got[:0]
		for _, n := range nodes {
			if n.State == "ready" {
				got = append(got, n.ID)
			}
		}
		slices.Sort(got)
		if err == nil && slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready kiln nodes %v (%v); want every GPU node of the cluster %v", got, err, want)
		}
	}
	return admin, bin, data
}
