package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/snapshot"
)

const a100MIGCapture = "../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"

// a100MIGUUID is the GPU UUID in the A100 MIG capture; its four MIG
// devices (GPU instances 3 to 6) carry no UUID of their own there.
const a100MIGUUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"

// copySnapshot is a deep copy of s named host, so that one recorded
// machine can stand for two nodes.
func copySnapshot(t *testing.T, s *snapshot.Snapshot, host string) *snapshot.Snapshot {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out snapshot.Snapshot
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	out.Host.Hostname = host
	return &out
}

func lease(t *testing.T, cl *api.Client, req api.LeaseRequest) *api.Lease {
	t.Helper()
	var l api.Lease
	if err := cl.Do(context.Background(), "POST", "/v1/leases", req, &l); err != nil {
		t.Fatalf("lease %+v: %v", req, err)
	}
	return &l
}

func release(t *testing.T, cl *api.Client, id string) {
	t.Helper()
	if err := cl.Do(context.Background(), "DELETE", "/v1/leases/"+id, nil, nil); err != nil {
		t.Fatalf("release %s: %v", id, err)
	}
}

func jobLog(t *testing.T, cl *api.Client, job string) string {
	t.Helper()
	resp, err := cl.Raw(context.Background(), "GET", "/v1/jobs/"+job+"/logs", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// waitLog waits until the job's log holds every one of want.
func waitLog(t *testing.T, cl *api.Client, job string, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := jobLog(t, cl, job)
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(out, w)
		}
		if ok {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s log %q, want %q", job, out, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldBy is what the nodes list shows each lease holding: lease -> node -> device ids.
func heldBy(t *testing.T, c *cluster) map[string]map[string][]string {
	t.Helper()
	var nl api.NodeList
	if err := c.admin.Do(context.Background(), "GET", "/v1/nodes", nil, &nl); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	for _, n := range nl.Nodes {
		for _, d := range n.Devices {
			for _, l := range d.Leases {
				if out[l] == nil {
					out[l] = map[string][]string{}
				}
				out[l][n.ID] = append(out[l][n.ID], d.ID)
			}
		}
	}
	return out
}

// ledgerHeld is what the executors' ledger shows held now: node -> devices.
func (l *ledger) heldNow() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for key, m := range l.held {
		if len(m) == 0 {
			continue
		}
		node, dev, _ := strings.Cut(key, "/")
		out[node] = append(out[node], dev)
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// waitLedger waits until the ledger shows want devices held per node.
func waitLedger(t *testing.T, led *ledger, want map[string]int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := led.heldNow()
		ok := len(got) == len(want)
		for n, k := range want {
			ok = ok && len(got[n]) == k
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger holds %v, want counts %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkGang checks a granted gang of 16: 8 H100s on each HGX node, every
// one exclusive and none twice.
func checkGang(t *testing.T, l *api.Lease) {
	t.Helper()
	if l.State != api.LeaseGranted || l.GrantedAt == nil {
		t.Fatalf("gang %s: %s (%s), want granted", l.ID, l.State, l.Reason)
	}
	per := map[string]int{}
	seen := map[string]bool{}
	for _, a := range l.Allocations {
		for _, g := range a.Devices {
			key := a.Node + "/" + g.ID
			if seen[key] {
				t.Errorf("gang %s: %s granted twice", l.ID, key)
			}
			seen[key] = true
			per[a.Node]++
			if g.Isolation != api.IsolationExclusive || g.MilliGPU != 1000 || !strings.Contains(g.Model, "H100") {
				t.Errorf("gang %s: %s is %+v, want an exclusive H100", l.ID, key, g)
			}
		}
	}
	if len(per) != 2 || per["hgx-a"] != 8 || per["hgx-b"] != 8 {
		t.Errorf("gang %s granted %v, want 8 GPUs on each of hgx-a and hgx-b", l.ID, per)
	}
	if l.Isolation != api.IsolationExclusive || l.GPUs != 16 {
		t.Errorf("gang %s: isolation %s, %g GPUs; want exclusive, 16", l.ID, l.Isolation, l.GPUs)
	}
}

// TestGangAcrossNodes: two 8-GPU H100 machines and a 4-GPU L40S box. A gang
// of 16 H100s gets all 16 GPUs on the two HGX nodes at once, one task per
// node (rank 0 and 1 of 2, each with its own eight GPUs); gangs larger than
// the H100s (or than every NVIDIA GPU) are refused with the reason, never
// granted in part; with one GPU of one HGX node taken the gang waits,
// holding nothing, and is granted whole when that GPU frees; releasing the
// gang frees all 16. The executors' ledger sees no GPU held twice.
func TestGangAcrossNodes(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second, PreemptGrace: 200 * time.Millisecond})
	m := machines(t)
	led := newLedger()
	for node, s := range map[string]*snapshot.Snapshot{
		"hgx-a": copySnapshot(t, m["hgx"], "hgx-a"),
		"hgx-b": copySnapshot(t, m["hgx"], "hgx-b"),
		"pcie":  m["pcie"],
	} {
		c.addAgent(node, s, &recording{node: node, inner: &process.Executor{}, l: led}, 100*time.Millisecond)
	}
	c.waitNodes(3)
	ctx := context.Background()
	cl := c.admin
	sleeper := func(tag string) *api.JobSpec {
		return &api.JobSpec{Command: []string{"/bin/sh", "-c",
			"echo " + tag + " rank=$KILN_RANK size=$KILN_WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES; exec sleep 60"}}
	}
	gang16 := api.LeaseRequest{Project: "default", GPUs: 16, Constraints: api.Constraints{Gang: true, Model: "H100"}}

	// 16 GPUs fit no node; without gang the request is refused.
	flat := gang16
	flat.Constraints.Gang = false
	if l := lease(t, cl, flat); l.State != api.LeaseRefused || !strings.Contains(l.Reason, "16 free GPUs") {
		t.Errorf("16 H100s without gang: %s %q, want refused (no node has 16)", l.State, l.Reason)
	}

	// 1. The gang is granted at once, 8 + 8.
	req := gang16
	req.Job = sleeper("first")
	g1 := lease(t, cl, req)
	checkGang(t, g1)
	waitLedger(t, led, map[string]int{"hgx-a": 8, "hgx-b": 8})
	out := waitLog(t, cl, g1.Jobs[0], "first rank=0 size=2", "first rank=1 size=2")
	// Each rank sees exactly its node's eight GPUs.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		_, cvd, ok := strings.Cut(line, "cvd=")
		if !ok {
			continue
		}
		if n := len(strings.Split(cvd, ",")); n != 8 {
			t.Errorf("gang task sees %d GPUs (%q), want 8", n, line)
		}
	}
	var job api.Job
	if err := cl.Do(ctx, "GET", "/v1/jobs/"+g1.Jobs[0], nil, &job); err != nil {
		t.Fatal(err)
	}
	if len(job.Tasks) != 2 || job.Tasks[0].Node == job.Tasks[1].Node {
		t.Errorf("gang job tasks %+v, want one on each HGX node", job.Tasks)
	}

	// 2. Gangs that can never be satisfied are refused, never granted in part.
	for _, bad := range []api.LeaseRequest{
		{Project: "default", GPUs: 24, Constraints: api.Constraints{Gang: true, Model: "H100"}},
		{Project: "default", GPUs: 21, Constraints: api.Constraints{Gang: true, Vendor: "nvidia"}},
	} {
		bad.Job = sleeper("never")
		l := lease(t, cl, bad)
		if l.State != api.LeaseRefused || !strings.Contains(l.Reason, "could ever") || !strings.Contains(l.Reason, fmt.Sprintf("%d free GPUs", bad.GPUs)) || !strings.Contains(l.Reason, "as a gang across nodes") {
			t.Errorf("gang of %d %+v: %s %q, want refused: no node could ever hold it", bad.GPUs, bad.Constraints, l.State, l.Reason)
		}
		if len(l.Allocations) != 0 || l.GrantedAt != nil {
			t.Errorf("refused gang %s has allocations %+v", l.ID, l.Allocations)
		}
		if _, ok := heldBy(t, c)[l.ID]; ok {
			t.Errorf("refused gang %s holds devices", l.ID)
		}
	}

	// 3. Releasing the gang frees every member.
	release(t, cl, g1.ID)
	if l := waitLease(t, cl, g1.ID, 10*time.Second, final); l.State != api.LeaseDone {
		t.Errorf("released gang ended %s: %s", l.State, l.Reason)
	}
	if h := heldBy(t, c); len(h) != 0 {
		t.Errorf("after release the nodes show held devices: %v", h)
	}
	waitLedger(t, led, map[string]int{})

	// 4. One GPU of hgx-b taken: the gang waits and holds nothing.
	blocker := lease(t, cl, api.LeaseRequest{Project: "default", GPUs: 1, Constraints: api.Constraints{Nodes: []string{"hgx-b"}}, Job: sleeper("blocker")})
	if blocker.State != api.LeaseGranted {
		t.Fatalf("blocker %s: %s", blocker.State, blocker.Reason)
	}
	waitLedger(t, led, map[string]int{"hgx-b": 1})
	req.Job = sleeper("second")
	g2 := lease(t, cl, req)
	time.Sleep(500 * time.Millisecond) // several heartbeats
	g2 = waitLease(t, cl, g2.ID, time.Second, func(*api.Lease) bool { return true })
	if g2.State != api.LeaseQueued || g2.QueuePosition != 1 || g2.Reason == "" {
		t.Errorf("gang with a member GPU busy: %s, position %d, reason %q; want queued first with a reason", g2.State, g2.QueuePosition, g2.Reason)
	}
	if !strings.Contains(g2.Reason, "16 free GPUs (model H100, as a gang across nodes)") || !strings.Contains(g2.Reason, "the gang found room for 15 on 2 node(s)") {
		t.Errorf("waiting gang's reason %q does not say it waits for 16 H100s as a gang", g2.Reason)
	}
	if len(g2.Allocations) != 0 || g2.GrantedAt != nil {
		t.Errorf("waiting gang has allocations %+v", g2.Allocations)
	}
	if held := heldBy(t, c); len(held[g2.ID]) != 0 || len(held) != 1 {
		t.Errorf("while the gang waits the nodes show %v held, want only the blocker's GPU", held)
	}
	if got := led.heldNow(); len(got) != 1 || len(got["hgx-b"]) != 1 {
		t.Errorf("while the gang waits the ledger shows %v, want only the blocker's GPU", got)
	}

	// 5. The blocker ends: the gang is granted whole.
	release(t, cl, blocker.ID)
	b := waitLease(t, cl, blocker.ID, 10*time.Second, final)
	g2 = waitLease(t, cl, g2.ID, 10*time.Second, func(l *api.Lease) bool { return l.State != api.LeaseQueued })
	checkGang(t, g2)
	if b.EndedAt == nil || g2.GrantedAt.Before(*b.EndedAt) {
		t.Errorf("gang granted at %v, before the blocker ended at %v", g2.GrantedAt, b.EndedAt)
	}
	waitLedger(t, led, map[string]int{"hgx-a": 8, "hgx-b": 8})
	waitLog(t, cl, g2.Jobs[0], "second rank=0 size=2", "second rank=1 size=2")

	// 6. Releasing it frees all 16 again: a second gang of 16 fits at once.
	release(t, cl, g2.ID)
	waitLease(t, cl, g2.ID, 10*time.Second, final)
	if h := heldBy(t, c); len(h) != 0 {
		t.Errorf("after release the nodes show held devices: %v", h)
	}
	waitLedger(t, led, map[string]int{})
	g3 := lease(t, cl, gang16)
	checkGang(t, g3)
	release(t, cl, g3.ID)
	waitLease(t, cl, g3.ID, 10*time.Second, final)

	for _, v := range led.violations {
		t.Error("ledger:", v)
	}
}

// migNode loads the A100 80GB in MIG mode with four 1g.20gb-sized
// instances (GPU instances 3, 4, 5, 6).
func migNode(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	s, err := capture.Load(context.Background(), a100MIGCapture)
	if err != nil {
		t.Fatal(err)
	}
	kb.Default().Annotate(s)
	s.Host.Hostname = "a100-mig-recorded"
	return s
}

// TestMIGLeases: a node replaying the A100 in MIG mode offers its four MIG
// instances, not the GPU. A MIG lease gets one instance, with MIG
// (hardware) isolation, and its job sees that instance (CUDA_VISIBLE_DEVICES
// names it, not GPU 0); four leases get four different instances, a fifth
// waits; one asking for a held instance by name waits until it is released
// and then gets that very instance. Fractions are never placed as MPS or
// time-slicing on the GPU whose MIG mode is on: a small one gets a MIG
// instance (stronger than MPS on the L40S beside it), with or without a
// memory size, one larger than any instance goes to the L40S or, kept to
// the A100, is refused. No job ever holds the A100 itself.
func TestMIGLeases(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second, PreemptGrace: 200 * time.Millisecond})
	m := machines(t)
	led := newLedger()
	for node, s := range map[string]*snapshot.Snapshot{"a100": migNode(t), "pcie": m["pcie"]} {
		c.addAgent(node, s, &recording{node: node, inner: &process.Executor{}, l: led}, 100*time.Millisecond)
	}
	nodes := c.waitNodes(2)
	cl := c.admin

	// The node offers gpu0 in MIG mode and its four instances.
	instUUID := map[string]string{}
	for _, n := range nodes {
		if n.ID != "a100" {
			continue
		}
		for _, d := range n.Devices {
			switch {
			case d.ID == "gpu0":
				if !d.MIGMode || d.Isolation != api.IsolationMIG {
					t.Errorf("a100 gpu0: mig mode %v isolation %s", d.MIGMode, d.Isolation)
				}
			case d.Parent == "gpu0":
				instUUID[d.ID] = d.UUID
				if d.Isolation != api.IsolationMIG {
					t.Errorf("%s isolation %s", d.ID, d.Isolation)
				}
			}
		}
		if n.Total != 1 || n.Free != 0 {
			t.Errorf("a100: %d GPUs, %g free for whole leases; want 1 and 0 (MIG mode)", n.Total, n.Free)
		}
	}
	for gi := 3; gi <= 6; gi++ {
		id := fmt.Sprintf("gpu0/mig%d.0", gi)
		if want := fmt.Sprintf("MIG-%s/%d/0", a100MIGUUID, gi); instUUID[id] != want {
			t.Errorf("%s: uuid %q, want %q (the capture names no MIG UUID: the GPU UUID with GI and CI)", id, instUUID[id], want)
		}
	}
	if len(instUUID) != 4 {
		t.Fatalf("a100 instances %v, want 4", instUUID)
	}

	// A whole GPU is not to be had on the A100.
	if l := lease(t, cl, api.LeaseRequest{Project: "default", GPUs: 1, Constraints: api.Constraints{Nodes: []string{"a100"}}}); l.State != api.LeaseRefused {
		t.Errorf("a whole GPU on the MIG-mode A100: %s, want refused", l.State)
	}

	// 1. One MIG instance, with its job.
	probe := func(tag string) *api.JobSpec {
		return &api.JobSpec{Command: []string{"/bin/sh", "-c",
			"echo " + tag + " cvd=$CUDA_VISIBLE_DEVICES nvd=$NVIDIA_VISIBLE_DEVICES iso=$KILN_ISOLATION mps=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.; exec sleep 60"}}
	}
	first := lease(t, cl, api.LeaseRequest{Project: "default", MIG: "1g.20gb", Job: probe("first")})
	if first.State != api.LeaseGranted || len(first.Allocations) != 1 || first.Allocations[0].Node != "a100" || len(first.Allocations[0].Devices) != 1 {
		t.Fatalf("MIG lease: %s %q %+v", first.State, first.Reason, first.Allocations)
	}
	g := first.Allocations[0].Devices[0]
	if _, ok := instUUID[g.ID]; !ok || g.Isolation != api.IsolationMIG || first.Isolation != api.IsolationMIG || g.UUID != instUUID[g.ID] || g.MilliGPU != 1000/7 {
		t.Errorf("MIG grant %+v (lease isolation %s), want one instance of gpu0, isolation mig, 1/7 of the GPU", g, first.Isolation)
	}
	want := fmt.Sprintf("first cvd=%s nvd=%s iso=mig mps=.", g.UUID, g.UUID)
	waitLog(t, cl, first.Jobs[0], want)

	// 2. Three more get the other three; a fifth waits.
	got := map[string]string{g.ID: first.ID}
	var others []*api.Lease
	for i := 0; i < 3; i++ {
		l := lease(t, cl, api.LeaseRequest{Project: "default", MIG: "1g.20gb", Job: probe(fmt.Sprintf("more%d", i))})
		if l.State != api.LeaseGranted {
			t.Fatalf("MIG lease %d: %s %q", i+2, l.State, l.Reason)
		}
		id := l.Allocations[0].Devices[0].ID
		if prev, dup := got[id]; dup {
			t.Errorf("%s granted to %s and %s", id, prev, l.ID)
		}
		got[id] = l.ID
		others = append(others, l)
	}
	fifth := lease(t, cl, api.LeaseRequest{Project: "default", MIG: "1g.20gb"})
	if fifth.State != api.LeaseQueued || fifth.Reason == "" {
		t.Errorf("fifth 1g.20gb: %s %q, want queued with a reason", fifth.State, fifth.Reason)
	}
	release(t, cl, fifth.ID)
	waitLedger(t, led, map[string]int{"a100": 4})

	// 3. The first lease's instance, asked for by name, waits for it.
	again := lease(t, cl, api.LeaseRequest{Project: "default", MIG: g.UUID, Job: probe("again")})
	if again.State != api.LeaseQueued {
		t.Errorf("lease for held instance %s: %s, want queued", g.UUID, again.State)
	}
	time.Sleep(300 * time.Millisecond)
	if l := waitLease(t, cl, again.ID, time.Second, func(*api.Lease) bool { return true }); l.State != api.LeaseQueued {
		t.Errorf("lease for held instance %s: %s, want still queued", g.UUID, l.State)
	}
	release(t, cl, first.ID)
	waitLease(t, cl, first.ID, 10*time.Second, final)
	again = waitLease(t, cl, again.ID, 10*time.Second, func(l *api.Lease) bool { return l.State != api.LeaseQueued })
	if again.State != api.LeaseGranted || again.Allocations[0].Devices[0].ID != g.ID || again.Isolation != api.IsolationMIG {
		t.Errorf("after release: %s %+v, want %s granted", again.State, again.Allocations, g.ID)
	}
	waitLog(t, cl, again.Jobs[0], fmt.Sprintf("again cvd=%s", g.UUID))
	for _, l := range append(others, again) {
		release(t, cl, l.ID)
		waitLease(t, cl, l.ID, 10*time.Second, final)
	}
	waitLedger(t, led, map[string]int{})

	// 4. Fractions and the MIG-mode GPU.
	small := lease(t, cl, api.LeaseRequest{Project: "default", Fraction: 0.1, MemoryBytes: 8 << 30, Job: probe("small")})
	if small.State != api.LeaseGranted || small.Allocations[0].Node != "a100" || small.Isolation != api.IsolationMIG ||
		!strings.HasPrefix(small.Allocations[0].Devices[0].ID, "gpu0/mig") {
		t.Errorf("0.1 of a GPU with 8 GiB: %s on %+v isolation %s, want a MIG instance of the A100", small.State, small.Allocations, small.Isolation)
	} else {
		waitLog(t, cl, small.Jobs[0], "small cvd="+small.Allocations[0].Devices[0].UUID+" ", "iso=mig mps=.")
	}
	half := lease(t, cl, api.LeaseRequest{Project: "default", Fraction: 0.5, MemoryBytes: 8 << 30, Job: probe("half")})
	if half.State != api.LeaseGranted || half.Allocations[0].Node != "pcie" || half.Isolation != api.IsolationMPS {
		t.Errorf("half a GPU: %s on %+v isolation %s, want MPS on the L40S box", half.State, half.Allocations, half.Isolation)
	}
	for _, r := range []api.LeaseRequest{
		{Project: "default", Fraction: 0.5, MemoryBytes: 8 << 30, Constraints: api.Constraints{Nodes: []string{"a100"}}},
		{Project: "default", Fraction: 0.5, Constraints: api.Constraints{Model: "A100"}},
	} {
		l := lease(t, cl, r)
		if l.State != api.LeaseRefused || l.Reason == "" {
			t.Errorf("half a GPU kept to the A100 %+v: %s %+v, want refused (no instance that large; MIG mode rules out MPS)", r.Constraints, l.State, l.Allocations)
		}
	}
	// A fraction that names no memory gets a whole instance's memory.
	tiny := lease(t, cl, api.LeaseRequest{Project: "default", Fraction: 0.1, Constraints: api.Constraints{Model: "A100"}, Job: probe("tiny")})
	if tiny.State != api.LeaseGranted || tiny.Isolation != api.IsolationMIG || len(tiny.Allocations) != 1 || len(tiny.Allocations[0].Devices) != 1 {
		t.Errorf("0.1 of an A100 without memory: %s %q %+v, want a MIG instance", tiny.State, tiny.Reason, tiny.Allocations)
	} else {
		d := tiny.Allocations[0].Devices[0]
		if d.ID == small.Allocations[0].Devices[0].ID || !strings.HasPrefix(d.ID, "gpu0/mig") || d.Isolation != api.IsolationMIG || d.MemoryBytes != 20937965568 {
			t.Errorf("0.1 of an A100 without memory placed as %+v, want another instance with its 19.5 GiB", d)
		}
		waitLog(t, cl, tiny.Jobs[0], "tiny cvd="+d.UUID+" ", "iso=mig mps=.")
	}
	for _, l := range []*api.Lease{small, half, tiny} {
		if !api.LeaseFinal(l.State) {
			release(t, cl, l.ID)
			waitLease(t, cl, l.ID, 10*time.Second, final)
		}
	}
	waitLedger(t, led, map[string]int{})

	// No job ever ran on the MIG-mode GPU itself.
	led.mu.Lock()
	for key := range led.held {
		if strings.HasPrefix(key, "a100/") && !strings.Contains(key, "gpu=0:") {
			t.Errorf("a job held %s, the GPU in MIG mode", key)
		}
	}
	led.mu.Unlock()
	for _, v := range led.violations {
		t.Error("ledger:", v)
	}
}
