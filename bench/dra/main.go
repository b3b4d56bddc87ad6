// Command dra measures kiln's DRA driver with the real kube-scheduler: a
// control plane on loopback (scripts/kube.sh builds it), -nodes nodes of 8
// GPUs published as gpu.kiln.dev ResourceSlices (half a recorded HGX H100
// board, one NVLink island of 8; half 8 A100 PCIe in NVLink-bridged pairs,
// sched/shapes), and a seeded stream of -pods pods with 1-, 2-, 4- and
// 8-GPU claims. Pods are bound by the scheduler and "run" until -live later
// pods are bound (then the benchmark deletes them), so the cluster stays
// busy without filling up.
//
// Two claim styles run on the same stream:
//
//   - kiln: 2- and 4-GPU claims ask first for GPUs in one NVLink island
//     (matchAttribute gpu.kiln.dev/nvlinkIsland) and fall back to any GPUs
//     (firstAvailable), as a user of kiln's attributes writes them;
//   - plain: every claim asks for N GPUs of the driver, as with a driver
//     that publishes no topology.
//
// It prints, per style, pods bound per second (first pod created to last
// pod bound) and the share of 2- and 4-GPU claims whose GPUs landed inside
// one NVLink island, beside kiln's own placement engine (package sched) on
// the same stream.
//
//	scripts/kube.sh && KILN_KUBE_BIN=... go run ./bench/dra -nodes 500 -pods 5000
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/dra/kubetest"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
)

const ns = "bench"

func main() {
	nodes := flag.Int("nodes", 500, "nodes of 8 GPUs")
	pods := flag.Int("pods", 5000, "pods in the stream")
	live := flag.Int("live", 0, "pods that run at once (0: about 60% of the GPUs busy)")
	seed := flag.Uint64("seed", 1, "seed of the pod stream")
	styles := flag.String("styles", "kiln,plain", "claim styles to run")
	workers := flag.Int("workers", 16, "concurrent pod creators")
	hgx := flag.String("hgx", "testdata/fixtures/h100-hgx8-sysfs", "recorded HGX machine")
	flag.Parse()
	if err := run(*nodes, *pods, *live, *seed, strings.Split(*styles, ","), *workers, *hgx); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dra:", err)
		os.Exit(1)
	}
}

// job is one pod of the stream.
type job struct{ gpus int }

func stream(n int, seed uint64) []job {
	r := rand.New(rand.NewPCG(seed, 0x6b696c6e))
	out := make([]job, n)
	for i := range out {
		switch x := r.IntN(100); {
		case x < 50:
			out[i].gpus = 1
		case x < 75:
			out[i].gpus = 2
		case x < 92:
			out[i].gpus = 4
		default:
			out[i].gpus = 8
		}
	}
	return out
}

// fleet is the nodes with what kiln publishes for each.
type fleet struct {
	names   []string
	snaps   []*snapshot.Snapshot
	results map[string]*dra.Result
	island  map[string]map[string]int64 // node -> device -> island
}

func buildFleet(ctx context.Context, n int, hgxPath string) (*fleet, error) {
	hgx, err := source.Load(ctx, []string{hgxPath}, discover.Options{})
	if err != nil {
		return nil, fmt.Errorf("%w (run from the repository root or give -hgx)", err)
	}
	f := &fleet{results: map[string]*dra.Result{}, island: map[string]map[string]int64{}}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("node-%03d", i)
		var s *snapshot.Snapshot
		if i%2 == 0 {
			c := *hgx
			c.Host.Hostname = name
			s = &c
		} else {
			s = shapes.NVLinkPairs8(name)
		}
		r, err := dra.Build(ctx, dra.Input{Snapshot: s, NodeName: name})
		if err != nil {
			return nil, err
		}
		f.names = append(f.names, name)
		f.snaps = append(f.snaps, s)
		f.results[name] = r
		f.island[name] = map[string]int64{}
		for _, d := range r.Devices() {
			if a := d.Attributes[dra.AttrNVLinkIsland]; a.IntValue != nil {
				f.island[name][d.Name] = *a.IntValue
			}
		}
	}
	return f, nil
}

func run(nNodes, nPods, live int, seed uint64, styles []string, workers int, hgxPath string) error {
	// An interrupt ends the run and still stops the control plane.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	jobs := stream(nPods, seed)
	mean := 0.0
	for _, j := range jobs {
		mean += float64(j.gpus)
	}
	mean /= float64(len(jobs))
	if live <= 0 {
		live = int(0.6 * float64(nNodes*8) / mean)
	}
	t0 := time.Now()
	f, err := buildFleet(ctx, nNodes, hgxPath)
	if err != nil {
		return err
	}
	fmt.Printf("fleet: %d nodes (%d HGX H100 8-GPU islands, %d with 4 NVLink pairs), %d GPUs, built in %s\n",
		nNodes, (nNodes+1)/2, nNodes/2, nNodes*8, time.Since(t0).Round(time.Millisecond))
	fmt.Printf("stream: %d pods, mean %.2f GPUs, %d running at once, seed %d\n", nPods, mean, live, seed)

	type row struct {
		name           string
		bound, pending int
		rate, steady   float64
		in2, n2        int
		in4, n4        int
		wall           time.Duration
	}
	var rows []row

	// kiln's own placement engine on the same stream.
	{
		var ns []*sched.Node
		for _, s := range f.snaps {
			n, err := sched.NodeFromSnapshot(s, nil, nil)
			if err != nil {
				return err
			}
			ns = append(ns, n)
		}
		c, err := sched.NewCluster(ns)
		if err != nil {
			return err
		}
		st := sched.NewState(c)
		sc := sched.Default(seed)
		r := row{name: "kiln sched (in-process)"}
		var running []string
		start := time.Now()
		for i, j := range jobs {
			id := fmt.Sprintf("j%d", i)
			a, err := sc.Place(st, sched.Request{ID: id, GPUs: j.gpus})
			if err != nil {
				r.pending++
				continue
			}
			if err := st.CommitOne(a); err != nil {
				return err
			}
			r.bound++
			running = append(running, id)
			if len(running) > live {
				if err := st.Release(running[0]); err != nil {
					return err
				}
				running = running[1:]
			}
			if j.gpus == 2 || j.gpus == 4 {
				isl := map[int64]bool{}
				inIsland := true
				for _, sh := range a.Devices {
					v, ok := f.island[a.Node][fmt.Sprintf("gpu-%d", sh.Device)]
					if !ok {
						inIsland = false
					}
					isl[v] = true
				}
				inIsland = inIsland && len(isl) == 1
				count(&r.in2, &r.n2, &r.in4, &r.n4, j.gpus, inIsland)
			}
		}
		r.wall = time.Since(start)
		r.rate = float64(r.bound) / r.wall.Seconds()
		r.steady = r.rate
		rows = append(rows, r)
	}

	dir, err := os.MkdirTemp("", "kiln-bench-dra-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logf, err := os.Create(dir + "/control-plane.log")
	if err != nil {
		return err
	}
	defer logf.Close()
	cp, err := kubetest.Start(ctx, dir, kubetest.Options{ControllerManager: true, SchedulerQPS: 1000, Log: logf})
	if err != nil {
		return err
	}
	defer cp.Stop()
	c := cp.Client
	t0 = time.Now()
	if err := publish(ctx, c, f, workers); err != nil {
		return err
	}
	fmt.Printf("published %d nodes and their slices in %s\n", nNodes, time.Since(t0).Round(time.Millisecond))
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	plainClass := resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "plain.gpu.kiln.dev"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == 'gpu.kiln.dev'"}}}}}
	for _, dc := range append(dra.DeviceClasses(), plainClass) {
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, style := range styles {
		res, err := runStyle(ctx, c, f, jobs, style, live, workers)
		if err != nil {
			return fmt.Errorf("style %s: %w", style, err)
		}
		r := row{name: "kube-scheduler, " + style + " claims", bound: res.bound, pending: res.pending, wall: res.wall, steady: res.steady,
			in2: res.in2, n2: res.n2, in4: res.in4, n4: res.n4}
		r.rate = float64(res.bound) / res.wall.Seconds()
		rows = append(rows, r)
	}

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "placement\tpods bound\tnot bound\tpods/s (all)\tpods/s (10-90%)\t2-GPU in one island\t4-GPU in one island\twall")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%s\t%s\t%s\n", r.name, r.bound, r.pending, r.rate, r.steady, share(r.in2, r.n2), share(r.in4, r.n4), r.wall.Round(time.Millisecond))
	}
	tw.Flush()
	fmt.Println("\nkube-scheduler's own DRA floors (test/integration/scheduler_perf, v1.37.2, 500 nodes, 5000 pods): 56 pods/s in CI, typically above 70.")
	return nil
}

func count(in2, n2, in4, n4 *int, gpus int, in bool) {
	switch gpus {
	case 2:
		*n2++
		if in {
			*in2++
		}
	case 4:
		*n4++
		if in {
			*in4++
		}
	}
}

func share(in, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%% (%d/%d)", 100*float64(in)/float64(n), in, n)
}

// publish creates the nodes and their slices.
func publish(ctx context.Context, c kubernetes.Interface, f *fleet, workers int) error {
	work := make(chan string)
	errs := make(chan error, len(f.names))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				if _, err := kubetest.AddNode(ctx, c, name); err != nil {
					errs <- err
					continue
				}
				for _, o := range f.results[name].Objects() {
					if _, err := c.ResourceV1().ResourceSlices().Create(ctx, &o, metav1.CreateOptions{}); err != nil {
						errs <- err
					}
				}
			}
		}()
	}
	for _, n := range f.names {
		work <- n
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

type styleResult struct {
	bound, pending int
	// steady is pods bound per second between the 10th and 90th percent
	// of bindings.
	steady  float64
	wall    time.Duration
	in2, n2 int
	in4, n4 int
}

func claimFor(style string, i int, gpus int) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d", style, i), Namespace: ns,
		Labels: map[string]string{"gpus": fmt.Sprint(gpus)}}}
	exact := func(class string) *resourceapi.ExactDeviceRequest {
		return &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(gpus)}
	}
	if style == "plain" {
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: exact("plain.gpu.kiln.dev")}}
		return c
	}
	if gpus != 2 && gpus != 4 {
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: exact(dra.ClassGPU)}}
		return c
	}
	island := resourceapi.FullyQualifiedName(dra.DriverName + "/" + dra.AttrNVLinkIsland)
	sub := func(name string) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: dra.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(gpus)}
	}
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{sub("island"), sub("any")}}}
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpus/island"}, MatchAttribute: &island}}
	return c
}

// runStyle streams the pods of one claim style through the scheduler.
func runStyle(ctx context.Context, c kubernetes.Interface, f *fleet, jobs []job, style string, live, workers int) (styleResult, error) {
	var res styleResult
	var mu sync.Mutex
	boundAt := map[string]time.Time{}
	var order []string // bound pods, oldest first
	released := map[string]bool{}
	counted := map[string]bool{}
	done := make(chan struct{})
	lastBind := time.Now()
	offeredAll := false

	release := func(pod string) {
		zero := int64(0)
		_ = c.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = c.ResourceV1().ResourceClaims(ns).Delete(ctx, strings.TrimPrefix(pod, "pod-"), metav1.DeleteOptions{})
	}
	onPod := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" || !strings.HasPrefix(p.Name, "pod-"+style) {
			return
		}
		mu.Lock()
		if _, seen := boundAt[p.Name]; seen {
			mu.Unlock()
			return
		}
		boundAt[p.Name] = time.Now()
		lastBind = time.Now()
		order = append(order, p.Name)
		var old string
		if len(order)-len(released) > live {
			for _, o := range order {
				if !released[o] {
					old = o
					break
				}
			}
			released[old] = true
		}
		n := len(boundAt)
		mu.Unlock()
		if old != "" {
			go release(old)
		}
		if n == len(jobs) {
			close(done)
		}
	}
	onClaim := func(obj any) {
		cl, ok := obj.(*resourceapi.ResourceClaim)
		if !ok || cl.Status.Allocation == nil || !strings.HasPrefix(cl.Name, style) {
			return
		}
		g := cl.Labels["gpus"]
		if g != "2" && g != "4" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if counted[cl.Name] {
			return
		}
		counted[cl.Name] = true
		isl := map[int64]bool{}
		in := true
		for _, r := range cl.Status.Allocation.Devices.Results {
			v, ok := f.island[r.Pool][r.Device]
			in = in && ok
			isl[v] = true
		}
		in = in && len(isl) == 1
		if g == "2" {
			count(&res.in2, &res.n2, &res.in4, &res.n4, 2, in)
		} else {
			count(&res.in2, &res.n2, &res.in4, &res.n4, 4, in)
		}
	}
	// Informers, not bare watches: the apiserver ends a watch that falls
	// behind, and an informer lists and watches again.
	inf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	if _, err := inf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }}); err != nil {
		return res, err
	}
	if _, err := inf.Resource().V1().ResourceClaims().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onClaim, UpdateFunc: func(_, o any) { onClaim(o) }}); err != nil {
		return res, err
	}
	stopInf := make(chan struct{})
	defer close(stopInf)
	inf.Start(stopInf)
	inf.WaitForCacheSync(stopInf)

	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	var createErr error
	var errOnce sync.Once
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				cl := claimFor(style, i, jobs[i].gpus)
				if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, cl, metav1.CreateOptions{}); err != nil {
					errOnce.Do(func() { createErr = err })
					continue
				}
				pod := kubetest.PodFor("pod-"+cl.Name, ns, cl.Name, "")
				if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
					errOnce.Do(func() { createErr = err })
				}
			}
		}()
	}
	// Pods are offered at most -live ahead of those bound, as a queue of
	// jobs would be.
	go func() {
		for i := range jobs {
			for {
				mu.Lock()
				ahead := i - len(boundAt)
				mu.Unlock()
				if ahead < live {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			work <- i
		}
		close(work)
		mu.Lock()
		offeredAll = true
		mu.Unlock()
	}()
	// A pod that waits with nothing binding (an 8-GPU claim on a busy
	// cluster) frees the oldest running pod, as a finishing job would.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(30 * time.Minute)
	lastReport := time.Now()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-timeout:
			break wait
		case <-ctx.Done():
			break wait
		case <-tick.C:
			mu.Lock()
			if time.Since(lastReport) > 5*time.Second {
				lastReport = time.Now()
				fmt.Fprintf(os.Stderr, "  %s: %d bound, %d released, %s\n", style, len(boundAt), len(released), time.Since(start).Round(time.Second))
			}
			idle := time.Since(lastBind) > 500*time.Millisecond
			var old string
			var drain []string
			if idle && offeredAll {
				// The stream is over: the running jobs end, and what still
				// waits (mostly 8-GPU claims on a fragmented cluster) binds.
				for _, o := range order {
					if !released[o] {
						released[o] = true
						drain = append(drain, o)
					}
				}
				lastBind = time.Now()
			} else if idle {
				for _, o := range order {
					if !released[o] {
						old = o
						break
					}
				}
				if old != "" {
					released[old] = true
					lastBind = time.Now()
				}
			}
			mu.Unlock()
			if old != "" {
				release(old)
			}
			for _, o := range drain {
				go release(o)
			}
		}
	}
	wg.Wait()
	if createErr != nil {
		return res, createErr
	}
	mu.Lock()
	res.bound = len(boundAt)
	res.pending = len(jobs) - res.bound
	var times []time.Time
	for _, t := range boundAt {
		times = append(times, t)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	if n := len(times); n > 0 {
		res.wall = times[n-1].Sub(start)
		if lo, hi := n/10, n*9/10; hi > lo && times[hi-1].After(times[lo]) {
			res.steady = float64(hi-1-lo) / times[hi-1].Sub(times[lo]).Seconds()
		}
	}
	mu.Unlock()
	// Let the claim watch catch up with the last allocations.
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	out := res
	mu.Unlock()
	return out, cleanup(ctx, c, style)
}

// cleanup deletes what a style left and waits until the claims are gone.
func cleanup(ctx context.Context, c kubernetes.Interface, style string) error {
	zero := int64(0)
	if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return err
	}
	if err := c.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		l, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("claims of style %s still there after 5 minutes", style)
}
