package kubetest

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/kube"
	"kiln.dev/kiln/snapshot"
)

// BenchmarkLeasesOnKubernetes offers b.N one-GPU image leases at a fixed
// rate (KILN_BENCH_RATE, default 10/s) to a kiln server with an agent per
// node for KILN_BENCH_NODES (default 500) 8-GPU nodes published on the
// control plane, twice in one run: the jobs as Pods (executor/kube, the
// real scheduler binds them) and standalone (an executor that starts at
// once, as a kiln agent on the node would). Each job runs 1 s (the test
// writes the Pod's end, there being no kubelet). It reports grants/s and
// the p99 of the grant (the lease request's answer) and of the start (the
// Pod bound to kiln's devices, or the standalone executor's start), from
// each request's due time:
//
//	KILN_KUBE_BIN=$(scripts/kube.sh) go test -run '^$' -bench LeasesOnKubernetes -benchtime 1000x ./dra/kubetest
func BenchmarkLeasesOnKubernetes(b *testing.B) {
	setup(b)
	nodesN := 500
	if v := os.Getenv("KILN_BENCH_NODES"); v != "" {
		fmt.Sscan(v, &nodesN)
	}
	rate := 10.0
	if v := os.Getenv("KILN_BENCH_RATE"); v != "" {
		fmt.Sscan(v, &rate)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := publishFleet(b, ctx, nodesN)
	snaps := map[string]*snapshot.Snapshot{}
	all, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range nodes {
		snaps[n] = dra.NodeSnapshot(all.Items, n)
	}
	discover := func(n string) func(context.Context) (*snapshot.Snapshot, error) {
		return func(context.Context) (*snapshot.Snapshot, error) { return snaps[n], nil }
	}
	go kubelet(ctx, time.Second)
	b.ResetTimer()
	for _, backend := range []string{"kubernetes", "standalone"} {
		started := newStarts()
		admin := kilnServer(b, ctx, nodes, 5*time.Second, func(n string) (executor.Executor, func(context.Context) (*snapshot.Snapshot, error)) {
			if backend == "kubernetes" {
				return &kube.Executor{Client: cp.Client, Node: n, Poll: time.Second}, discover(n)
			}
			return &instant{starts: started, hold: time.Second}, discover(n)
		})
		if backend == "kubernetes" {
			go watchBound(ctx, started)
		}
		grant, start, elapsed := offer(b, ctx, admin, b.N, rate, started, backend)
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), backend+"-grants/s")
		b.ReportMetric(p99ms(grant), backend+"-grant-p99-ms")
		b.ReportMetric(p99ms(start), backend+"-start-p99-ms")
	}
}

// publishFleet adds n nodes to the control plane, each with the slices of
// the recorded HGX H100 (UUIDs made unique per node).
func publishFleet(b *testing.B, ctx context.Context, n int) []string {
	var out []string
	src := results["hgx-h100-sysfs"]
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-%04d", i)
		if _, err := AddNode(ctx, cp.Client, name); err != nil && !strings.Contains(err.Error(), "already exists") {
			b.Fatal(err)
		}
		for k, o := range src.Objects() {
			s := o.DeepCopy()
			s.Name = fmt.Sprintf("%s-%d", name, k)
			s.Spec.NodeName, s.Spec.Pool.Name = &name, name
			for j := range s.Spec.Devices {
				if u := s.Spec.Devices[j].Attributes[dra.AttrUUID].StringValue; u != nil {
					v := name + "-" + *u
					s.Spec.Devices[j].Attributes[dra.AttrUUID] = resourceapi.DeviceAttribute{StringValue: &v}
				}
			}
			if _, err := cp.Client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
				b.Fatal(err)
			}
		}
		out = append(out, name)
	}
	return out
}

// starts records when each job started, by job id.
type starts struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newStarts() *starts { return &starts{at: map[string]time.Time{}} }

func (s *starts) mark(job string) {
	s.mu.Lock()
	if _, ok := s.at[job]; !ok {
		s.at[job] = time.Now()
	}
	s.mu.Unlock()
}

func (s *starts) get(job string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[job]
	return t, ok
}

// instant is a standalone node's executor that starts a job at once and
// ends it after hold.
type instant struct {
	starts *starts
	hold   time.Duration
}

func (e *instant) Name() string { return "containerd" }
func (e *instant) NoCDI() bool  { return true }
func (e *instant) Start(_ context.Context, j executor.Job) (executor.Handle, error) {
	e.starts.mark(j.ID)
	return &instantHandle{end: time.Now().Add(e.hold)}, nil
}

type instantHandle struct{ end time.Time }

func (h *instantHandle) Logs() io.ReadCloser { return io.NopCloser(strings.NewReader("")) }
func (h *instantHandle) Wait(ctx context.Context) (executor.Exit, error) {
	select {
	case <-time.After(time.Until(h.end)):
	case <-ctx.Done():
	}
	return executor.Exit{Code: 0, Reason: "exited", Finished: time.Now()}, nil
}
func (h *instantHandle) Stop(context.Context, time.Duration) error { h.end = time.Now(); return nil }

// watchBound marks a job started when its Pod is bound.
func watchBound(ctx context.Context, s *starts) {
	w, err := cp.Client.CoreV1().Pods("kiln-default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*v1.Pod); ok && ev.Type != watch.Deleted && p.Spec.NodeName != "" {
			s.mark(p.Labels[kube.LabelJob])
		}
	}
}

// kubelet ends every bound kiln Pod after hold, as a kubelet would once
// the container exited 0.
func kubelet(ctx context.Context, hold time.Duration) {
	seen := map[string]time.Time{}
	for ctx.Err() == nil {
		l, err := cp.Client.CoreV1().Pods("kiln-default").List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range l.Items {
				p := &l.Items[i]
				if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded {
					continue
				}
				if seen[p.Name].IsZero() {
					seen[p.Name] = time.Now()
				} else if time.Since(seen[p.Name]) > hold {
					p.Status.Phase = v1.PodSucceeded
					p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "job", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}}}
					_, _ = cp.Client.CoreV1().Pods("kiln-default").UpdateStatus(ctx, p, metav1.UpdateOptions{})
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// offer sends n lease requests at rate, each counted from its due time,
// and waits for every job to start.
func offer(b *testing.B, ctx context.Context, admin *api.Client, n int, rate float64, s *starts, backend string) (grant, start []time.Duration, elapsed time.Duration) {
	interval := time.Duration(float64(time.Second) / rate)
	t0 := time.Now()
	type rec struct {
		due time.Time
		job string
	}
	recs := make([]rec, n)
	grant = make([]time.Duration, n)
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	for k := 0; k < n; k++ {
		due := t0.Add(time.Duration(k) * interval)
		time.Sleep(time.Until(due))
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			l, err := admin.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{Image: "registry.local/job:1"}})
			if err == nil && (l.State != api.LeaseGranted || len(l.Jobs) != 1) {
				err = fmt.Errorf("%s: lease %s %s (%s): the fleet is full at this rate", backend, l.ID, l.State, l.Reason)
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			grant[k] = time.Since(due)
			recs[k] = rec{due, l.Jobs[0]}
		}(k)
	}
	wg.Wait()
	elapsed = time.Since(t0)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	for _, r := range recs {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if at, ok := s.get(r.job); ok {
				start = append(start, at.Sub(r.due))
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: job %s did not start", backend, r.job)
			}
		}
	}
	return grant, start, elapsed
}

func p99ms(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	d = append([]time.Duration(nil), d...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)*99/100].Microseconds()) / 1000
}
