package kubetest

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/kube"
	"kiln.dev/kiln/snapshot"
)

// TestKilnServerOnKubernetes runs a real kiln server with kiln agents for
// two recorded Kubernetes nodes whose jobs are Pods (executor/kube): a
// lease with an image job becomes a ResourceClaim pinned to the GPUs kiln
// chose and a Pod that the real scheduler binds there; the Pod's end (the
// test writes the status a kubelet would, there being no kubelet) ends the
// job with its exit code; cancelling a lease deletes its Pod and claim.
func TestKilnServerOnKubernetes(t *testing.T) {
	setup(t)
	if testing.Short() {
		t.Skip("builds kiln and starts its server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := []string{"pcie-l40s-pairs", "rtx4090x8-mixed-load"}
	admin := kilnOnKube(t, ctx, nodes)
	// A lease of two GPUs with an image job.
	l, err := admin.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 2, Job: &api.JobSpec{Image: "registry.local/train:1", Command: []string{"train"}}})
	if err != nil {
		t.Fatal(err)
	}
	l = waitLease(t, admin, l.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted && len(l.Jobs) == 1 })
	node := l.Allocations[0].Node
	var uuids []string
	for _, d := range l.Allocations[0].Devices {
		uuids = append(uuids, d.PCIAddress)
	}
	slices.Sort(uuids)
	podName := "kiln-" + l.Jobs[0]
	ns := "kiln-default"
	pod, claim := waitPodBound(t, admin, l.Jobs[0], ns, podName)
	if pod.Spec.NodeName != node {
		t.Errorf("the scheduler bound the job's Pod to %s; kiln granted GPUs on %s", pod.Spec.NodeName, node)
	}
	var got []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Pool != node {
			t.Errorf("claim device %s/%s is not on kiln's node %s", r.Pool, r.Device, node)
		}
		got = append(got, *device(t, r.Pool, r.Device).Attributes[dra.AttrPCIBusID].StringValue)
	}
	slices.Sort(got)
	if !slices.Equal(got, uuids) {
		t.Errorf("the claim holds GPUs %v; kiln granted %v", got, uuids)
	}
	// The kubelet's part: the container ran and exited 3.
	pod.Status.Phase = v1.PodFailed
	pod.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "job", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 3, Reason: "Error"}}}}
	if _, err := cp.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l = waitLease(t, admin, l.ID, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	j, err := admin.GetJob(ctx, l.Jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	if j.ExitCode == nil || *j.ExitCode != 3 {
		t.Errorf("job ended %s with code %v, want 3 (the Pod's container)", j.State, j.ExitCode)
	}
	waitGone(t, ns, podName, true)

	// Cancelling a lease deletes its Pod and its claim.
	l2, err := admin.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{Image: "registry.local/serve:1"}})
	if err != nil {
		t.Fatal(err)
	}
	l2 = waitLease(t, admin, l2.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted && len(l.Jobs) == 1 })
	pod2 := "kiln-" + l2.Jobs[0]
	waitPodBound(t, admin, l2.Jobs[0], ns, pod2)
	if _, err := admin.CancelLease(ctx, l2.ID); err != nil {
		t.Fatal(err)
	}
	// kiln deletes the Pod with the lease's grace; a kubelet would stop
	// the container and remove the Pod, which the test does in its place.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, pod2, metav1.GetOptions{})
		if err == nil && p.DeletionTimestamp != nil {
			zero := int64(0)
			if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, pod2, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kiln did not delete the cancelled lease's Pod: %+v %v", p, err)
		}
	}
	waitGone(t, ns, pod2, false)
	waitLease(t, admin, l2.ID, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })

	// A Pod deleted outside kiln ends its job, and says so.
	l3, err := admin.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{Image: "registry.local/serve:1"}})
	if err != nil {
		t.Fatal(err)
	}
	l3 = waitLease(t, admin, l3.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted && len(l.Jobs) == 1 })
	pod3 := "kiln-" + l3.Jobs[0]
	waitPodBound(t, admin, l3.Jobs[0], ns, pod3)
	zero := int64(0)
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, pod3, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitLease(t, admin, l3.ID, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	j3, err := admin.GetJob(ctx, l3.Jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j3.Reason, "deleted outside kiln") {
		t.Errorf("job of a Pod deleted outside kiln ended %s: %q", j3.State, j3.Reason)
	}
	waitGone(t, ns, pod3, false)
}

func waitLease(t *testing.T, c *api.Client, id string, ok func(*api.Lease) bool) *api.Lease {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		l, err := c.GetLease(context.Background(), id, api.LeaseWait{})
		if err == nil && ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s: %+v %v", id, l, err)
		}
	}
}

func waitPodBound(t *testing.T, admin *api.Client, job, ns, name string) (*v1.Pod, *resourceapi.ResourceClaim) {
	t.Helper()
	// The agent creates the Pod when its heartbeat brings the job.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := cp.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			j, _ := admin.GetJob(context.Background(), job)
			t.Fatalf("no Pod %s/%s for the job; job %+v", ns, name, j)
		}
	}
	p, cl, err := WaitBound(context.Background(), cp.Client, ns, name, name, 60*time.Second)
	if err != nil {
		j, _ := admin.GetJob(context.Background(), job)
		t.Fatalf("the job's Pod: %v (%+v); job %+v", err, p, j)
	}
	return p, cl
}

// waitGone waits until the Pod (and, with the claim, its claim) is gone.
func waitGone(t *testing.T, ns, name string, podMayStay bool) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, perr := cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		_, cerr := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		podGone := apierrors.IsNotFound(perr) || podMayStay
		if podGone && apierrors.IsNotFound(cerr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s: pod %v, claim %v; want both gone", ns, name, perr, cerr)
		}
	}
}

// kilnOnKube starts a real kiln server and kiln agents (executor/kube) for
// the recorded nodes, and returns the admin's client once every node is
// ready for images.
func kilnOnKube(t *testing.T, ctx context.Context, nodes []string) *api.Client {
	t.Helper()
	return kilnServer(t, ctx, nodes, 300*time.Millisecond, func(node string) (executor.Executor, func(context.Context) (*snapshot.Snapshot, error)) {
		return &kube.Executor{Client: cp.Client, Config: cp.Config, Node: node, Poll: 100 * time.Millisecond}, kube.Discover(cp.Client, node)
	})
}

// kilnServer starts a real kiln server and an agent per node with the
// executor and discovery mk gives, and returns the admin's client once
// every node is ready for images.
func kilnServer(t testing.TB, ctx context.Context, nodes []string, heartbeat time.Duration, mk func(node string) (executor.Executor, func(context.Context) (*snapshot.Snapshot, error))) *api.Client {
	t.Helper()
	bin := buildBinaries(t, "kiln")
	admin, url, data := startServer(t, ctx, bin, nil, "--heartbeat-timeout", "10s")
	cfg, err := api.LoadClientConfig(filepath.Join(data, "admin-client.json"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(cfg.CAPEM))
	all, err := kube.GPUNodes(ctx, cp.Client)
	if err != nil || !slices.Contains(all, nodes[0]) || !slices.Contains(all, nodes[1]) || slices.Contains(all, "no-such") {
		t.Fatalf("GPU nodes %v %v", all, err)
	}
	jt, err := admin.CreateJoinToken(ctx, api.JoinTokenRequest{Uses: len(nodes)})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		// The server limits requests without credentials (10 a second):
		// a large fleet joins at that pace.
		id, err := agent.Join(ctx, url, jt.Secret, api.Fingerprint(block.Bytes), node, filepath.Join(t.TempDir(), node))
		for tries := 0; err != nil && strings.Contains(err.Error(), "too many requests") && tries < 300; tries++ {
			time.Sleep(200 * time.Millisecond)
			id, err = agent.Join(ctx, url, jt.Secret, api.Fingerprint(block.Bytes), node, filepath.Join(t.TempDir(), node))
		}
		if err != nil {
			t.Fatal(err)
		}
		ke, discover := mk(node)
		ag, err := agent.New(agent.Config{Identity: id, Executor: ke, Containers: ke, Heartbeat: heartbeat,
			CDIDir: t.TempDir(), WorkDir: t.TempDir(),
			Discover: discover})
		if err != nil {
			t.Fatal(err)
		}
		go ag.Run(ctx)
	}
	for _, node := range nodes {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			n, err := admin.Node(ctx, node)
			if err == nil && n.State == api.NodeReady && n.Containers != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s not ready for images: %+v %v", node, n, err)
			}
		}
	}

	return admin
}

// TestKilnOnKubernetesFairShareAndLedger runs a few hundred one-GPU leases
// of two projects, weights 1 and 3, through kiln server --backend
// kubernetes (its own kiln-dra agents, as deploy/server runs it):
// while both have leases waiting, the GPU-seconds granted follow the
// weights, and an independent ledger over the claims' allocations (a watch
// of the apiserver, not kiln's records) never sees one device held by two
// claims at once. The test stands in for the kubelet: a Pod bound for
// 300 ms is marked Succeeded.
func TestKilnOnKubernetesFairShareAndLedger(t *testing.T) {
	setup(t)
	if testing.Short() {
		t.Skip("a few hundred leases through kiln's server and the scheduler")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// kiln server --backend kubernetes, as a lab runs it: its own
	// kiln-dra agents join every GPU node; all but two are drained, so
	// that 12 GPUs are shared.
	admin, _, _ := kilnServerBackend(t, ctx, "kf-", nil)
	used := []string{"pcie-l40s-pairs", "rtx4090x8-mixed-load"}
	nodes, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !slices.Contains(used, n.ID) {
			if _, err := admin.DrainNode(ctx, n.ID, api.DrainRequest{Reason: "the test shares two nodes"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, w := range map[string]float64{"light": 1, "heavy": 3} {
		if _, err := admin.PutProject(ctx, api.Project{Name: name, Weight: w}); err != nil {
			t.Fatal(err)
		}
	}

	// The ledger: every claim's devices, from a watch of all claims.
	var mu sync.Mutex
	holds := map[string]string{} // pool/device -> claim
	byClaim := map[string][]string{}
	var overlaps []string
	seen := map[string]bool{} // claims seen allocated
	w, err := cp.Client.ResourceV1().ResourceClaims("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok {
				continue
			}
			key := c.Namespace + "/" + c.Name
			mu.Lock()
			for _, d := range byClaim[key] {
				delete(holds, d)
			}
			delete(byClaim, key)
			if ev.Type != watch.Deleted && c.Status.Allocation != nil {
				for _, r := range c.Status.Allocation.Devices.Results {
					d := r.Pool + "/" + r.Device
					if other, held := holds[d]; held && other != key {
						overlaps = append(overlaps, fmt.Sprintf("%s held by %s and %s", d, other, key))
					}
					holds[d] = key
					byClaim[key] = append(byClaim[key], d)
					seen[key] = true
				}
			}
			mu.Unlock()
		}
	}()

	// The kubelet's part.
	go func() {
		boundAt := map[string]time.Time{}
		for ctx.Err() == nil {
			for _, ns := range []string{"kf-light", "kf-heavy"} {
				l, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					continue
				}
				for i := range l.Items {
					p := &l.Items[i]
					if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.DeletionTimestamp != nil {
						continue
					}
					k := ns + "/" + p.Name
					if boundAt[k].IsZero() {
						boundAt[k] = time.Now()
						continue
					}
					if time.Since(boundAt[k]) > 300*time.Millisecond {
						p.Status.Phase = v1.PodSucceeded
						p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "job", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}}}
						_, _ = cp.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	const perProject = 100
	ids := map[string][]string{}
	for i := 0; i < perProject; i++ {
		for _, p := range []string{"light", "heavy"} {
			l, err := admin.CreateLease(ctx, api.LeaseRequest{Project: p, GPUs: 1, Job: &api.JobSpec{Image: "registry.local/job:1"}})
			if err != nil {
				t.Fatal(err)
			}
			ids[p] = append(ids[p], l.ID)
		}
	}
	t0 := time.Now()
	leases := map[string][]*api.Lease{}
	for _, p := range []string{"light", "heavy"} {
		for _, id := range ids[p] {
			leases[p] = append(leases[p], waitLeaseFor(t, admin, id, 5*time.Minute))
		}
	}
	elapsed := time.Since(t0)
	// The window in which both projects had leases waiting: until the
	// first project's last grant.
	lastGrant := func(ls []*api.Lease) time.Time {
		var last time.Time
		for _, l := range ls {
			if l.GrantedAt != nil && l.GrantedAt.After(last) {
				last = *l.GrantedAt
			}
		}
		return last
	}
	end := lastGrant(leases["light"])
	if h := lastGrant(leases["heavy"]); h.Before(end) {
		end = h
	}
	secs := map[string]float64{}
	for p, ls := range leases {
		for _, l := range ls {
			if l.GrantedAt == nil || l.EndedAt == nil || !l.GrantedAt.Before(end) {
				continue
			}
			stop := *l.EndedAt
			if stop.After(end) {
				stop = end
			}
			secs[p] += stop.Sub(*l.GrantedAt).Seconds()
		}
	}
	share := secs["heavy"] / (secs["heavy"] + secs["light"])
	t.Logf("%d leases in %s; while both waited: GPU-seconds light %.1f, heavy %.1f: heavy's share %.3f (weights say 0.750)",
		2*perProject, elapsed.Round(time.Millisecond), secs["light"], secs["heavy"], share)
	if share < 0.65 || share > 0.85 {
		t.Errorf("heavy's share of GPU-seconds %.3f, want within 0.10 of its weight's 0.750", share)
	}
	// kiln's grants, from its lease records: no device in two leases
	// whose times overlap (the scheduler would refuse the second claim, so
	// the claims alone could not show it).
	type span struct {
		from, to time.Time
		id       string
	}
	byDevice := map[string][]span{}
	for _, ls := range leases {
		for _, l := range ls {
			if l.GrantedAt == nil || l.EndedAt == nil {
				continue
			}
			for _, a := range l.Allocations {
				for _, d := range a.Devices {
					byDevice[a.Node+"/"+d.ID] = append(byDevice[a.Node+"/"+d.ID], span{*l.GrantedAt, *l.EndedAt, l.ID})
				}
			}
		}
	}
	for dev, ss := range byDevice {
		sort.Slice(ss, func(i, j int) bool { return ss[i].from.Before(ss[j].from) })
		for i := 1; i < len(ss); i++ {
			if ss[i].from.Before(ss[i-1].to) {
				t.Errorf("kiln granted %s to %s and %s at once", dev, ss[i-1].id, ss[i].id)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("devices held by two claims at once: %v", overlaps)
	}
	if len(seen) < 2*perProject {
		t.Errorf("the ledger saw %d claims allocated, want %d", len(seen), 2*perProject)
	}
	t.Logf("ledger: %d claims allocated, no device held twice; kiln's grants on %d devices never overlap", len(seen), len(byDevice))
}

func waitLeaseFor(t *testing.T, c *api.Client, id string, d time.Duration) *api.Lease {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		l, err := c.GetLease(context.Background(), id, api.LeaseWait{})
		if err == nil && api.LeaseFinal(l.State) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s not ended: %+v %v", id, l, err)
		}
	}
}

// buildBinaries builds the programs of cmd/ into one folder, as users
// install them side by side, and returns the folder.
func buildBinaries(t testing.TB, programs ...string) string {
	t.Helper()
	bin := t.TempDir()
	for _, p := range programs {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, p), "../../cmd/"+p).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", p, err, out)
		}
	}
	return bin
}

// startServer runs bin/kiln server on a free loopback port with a data
// folder of its own and the extra flags, in a process group the test ends
// (the server and what it started); it returns the admin's client once
// the server answers, its URL and its data folder.
func startServer(t testing.TB, ctx context.Context, bin string, env []string, extra ...string) (*api.Client, string, string) {
	t.Helper()
	data := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	url := "https://" + addr
	srv := exec.Command(filepath.Join(bin, "kiln"), append([]string{"server", "--data", data, "--listen", addr, "--url", url}, extra...)...)
	srv.Env = append(os.Environ(), env...)
	srv.Stdout, srv.Stderr = os.Stderr, os.Stderr
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-srv.Process.Pid, syscall.SIGTERM)
		srv.Wait()
	})
	cfgPath := filepath.Join(data, "admin-client.json")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cfg, err := api.LoadClientConfig(cfgPath); err == nil {
			if c, err := cfg.Client(); err == nil && c.Health(ctx) == nil {
				return c, url, data
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("kiln server did not come up")
		}
	}
}
