package store

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// The database in testdata/v3.db was made by TestMakeFixture with the
// store of an earlier kiln, whose rows were the JSON of package api (see
// testdata/README). TestFixture opens a copy of it and checks that every
// read gives the values below; TestFixtureRowsAsWritten that the store
// writes those values as that kiln did.

var writeFixture = flag.Bool("write-fixture", false, "write testdata/v3.db from the values of fixture_test.go")

const fixturePath = "testdata/v3.db"

// at is a time of the fixture: day d of March 2025, hour h, with
// nanoseconds so that the stored precision is checked too.
func at(d, h int) time.Time { return time.Date(2025, 3, d, h, 0, 0, 123456789, time.UTC) }

func atp(d, h int) *time.Time { t := at(d, h); return &t }

func intp(i int) *int { return &i }

var fixtureUsers = []api.User{ // by name, as Users lists them
	{ID: "u-admin", Name: "admin", Role: api.RoleAdmin, Projects: []string{"default"}, Created: at(1, 8)},
	{ID: "u-ana", Name: "ana", Role: api.RoleMember, Projects: []string{"nlp", "vision"}, Created: at(1, 9)},
	{ID: "u-bob", Name: "bob", Role: api.RoleMember, Created: at(2, 9)},
}

var fixtureProjects = []api.Project{ // by name; HeldGPUs and the like are not stored
	{Name: "default", Weight: 1, PeriodSeconds: 30 * 24 * 3600, Members: []string{"admin"}},
	{Name: "nlp", Weight: 0.5, GPUHours: 100, PeriodSeconds: 7 * 24 * 3600, Members: []string{"ana"},
		Limits: api.Limits{MaxQueued: 8}},
	{Name: "vision", Weight: 2, MaxGPUs: 4.5, GPUHours: 1000, PeriodSeconds: 24 * 3600, Members: []string{"ana"},
		Limits: api.Limits{MaxQueued: 10, MaxQueuedPerUser: 3, MaxJobsPerLease: 20, MaxEnvBytes: 65536,
			MaxLogBytesPerJob: 1 << 20, MaxLogBytes: 1 << 30}},
}

var fixtureMembers = [][2]string{{"default", "u-admin"}, {"vision", "u-ana"}, {"nlp", "u-ana"}}

var fixtureTokens = []TokenRow{ // by creation
	{ID: "tok-boot", UserID: "u-admin", Name: "bootstrap", Hash: []byte{0x01, 0x02, 0x03, 0xfe}, Created: at(1, 8)},
	{ID: "tok-ana", UserID: "u-ana", Name: "laptop", Hash: []byte("ana's hash"), Created: at(1, 10), Expires: at(31, 10)},
	{ID: "tok-bob", UserID: "u-bob", Hash: []byte{0}, Created: at(2, 10)},
}

// fixtureJoinTokens are as JoinTokens lists them, newest first: one
// unused, one used up, one revoked after a use.
var fixtureJoinTokens = []JoinTokenRow{
	{ID: "jt-fresh", Hash: []byte("fresh"), Created: at(3, 12), Expires: at(3, 13), Uses: 5, Used: 0},
	{ID: "jt-revoked", Hash: []byte("revoked"), Created: at(2, 12), Expires: at(4, 12), Uses: 3, Used: 1, Revoked: at(2, 14)},
	{ID: "jt-spent", Hash: []byte("spent"), Created: at(1, 12), Expires: at(1, 13), Uses: 1, Used: 1},
}

var fixtureSandbox = &api.Sandbox{User: "kiln-job-1001", OwnUser: true, PIDNamespace: true, MountNamespace: true,
	PrivateTmp: true, CleanEnv: true, NoNewPrivs: true, Cgroup: true, Devices: false, Missing: []string{"devices: no eBPF"}}

// fixtureNodes are by id.
var fixtureNodes = []NodeRecord{
	{
		Node: api.Node{ID: "hgx-1", State: api.NodeReady, LastSeen: at(3, 11), Hostname: "hgx-1.lab", Executor: "process",
			Containers: "containerd", Driver: "550.54.15", CUDA: "12.4", Sandbox: fixtureSandbox,
			Devices: []api.Device{
				{ID: "gpu0", Vendor: "nvidia", Index: 0, Model: "NVIDIA H100 80GB HBM3", Architecture: "hopper", ComputeCapability: "9.0",
					PCIAddress: "0000:18:00.0", UUID: "GPU-aaaa", MemoryBytes: 85899345920, NUMANode: intp(0), Island: "nvl-0",
					Isolation: api.IsolationMPS, UsedMilli: 1000, Leases: []string{"l-granted"}},
				{ID: "gpu1", Vendor: "nvidia", Index: 1, Model: "NVIDIA H100 80GB HBM3", MIGMode: true, Isolation: api.IsolationMIG,
					Drained: true, DrainReason: "doctor: xid 79", NUMANode: intp(1)},
				{ID: "gpu1/mig-1.0", Vendor: "nvidia", Index: 1, MIGProfile: "1g.10gb", Parent: "gpu1", MemoryBytes: 10 << 30,
					Isolation: api.IsolationMIG, Held: true, Leases: []string{"l-lost"}},
			},
			Findings: []api.Finding{{ID: "xid-79", Severity: "critical", Title: "GPU fell off the bus", Devices: []string{"gpu1"}}},
			Joined:   at(1, 11), Free: 0.5, Total: 2},
		Snapshot: &snapshot.Snapshot{SchemaVersion: 1, CollectedAt: at(3, 11),
			Host: snapshot.Host{Hostname: "hgx-1.lab", Kernel: "6.8.0", CPUs: 224},
			GPUs: []snapshot.GPU{{Index: 0, Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-aaaa"}}},
		CertSHA256: "c3a1", KeySHA256: "k3a1",
	},
	{
		Node: api.Node{ID: "hgx-2", State: api.NodeLost, LastSeen: at(2, 11), Recorded: true, NoContainers: "containerd: socket missing",
			Devices: []api.Device{{ID: "gpu0", Vendor: "amd", Index: 0, Isolation: api.IsolationTimeSlicing}},
			Joined:  at(1, 12), Total: 1},
		CertSHA256: "c3a2", Replacing: true,
	},
}

var fixtureDevices = map[string]map[string]DeviceState{
	"hgx-1": {"gpu1": {Drained: true, Reason: "doctor: xid 79"}, "gpu0": {}},
	"hgx-2": {"gpu0": {Drained: true}},
}

// fixtureLeases are one lease in every state, newest first (as Leases
// lists them).
var fixtureLeases = []*api.Lease{
	{ID: "l-queued", Project: "vision", User: "ana", State: api.LeaseQueued, CreatedAt: at(3, 9), GPUs: 2,
		Request: api.LeaseRequest{Project: "vision", Name: "train", GPUs: 2, TimeLimitSeconds: 3600, Priority: 3, Preemptible: true,
			Constraints: api.Constraints{Vendor: "nvidia", Model: "H100", Architecture: "hopper", MinMemoryBytes: 80 << 30,
				MinComputeCapability: "9.0", MinDriver: "535.104", MinCUDA: "12.2", SameNVLinkIsland: true, SameNUMA: true,
				Gang: true, Nodes: []string{"hgx-1", "hgx-2"}},
			Require:   []string{api.SandboxOwnUser, api.SandboxCgroup},
			Resources: api.Resources{CPUMilli: 8000, MemoryBytes: 64 << 30}}},
	{ID: "l-granted", Project: "vision", User: "ana", State: api.LeaseGranted, CreatedAt: at(3, 8), GrantedAt: atp(3, 8), EndsAt: atp(3, 20),
		GPUs: 1.5, Isolation: api.IsolationMPS, Jobs: []string{"j-running"},
		Request: api.LeaseRequest{Project: "vision", GPUs: 1, Job: &api.JobSpec{Command: []string{"python", "train.py"},
			Env: map[string]string{"EPOCHS": "3"}, WorkDir: "/srv/train"}},
		Allocations: []api.Allocation{
			{Node: "hgx-1", Sandbox: fixtureSandbox, Devices: []api.DeviceGrant{
				{ID: "gpu0", Vendor: "nvidia", Index: 0, PCIAddress: "0000:18:00.0", UUID: "GPU-aaaa", Model: "NVIDIA H100 80GB HBM3",
					MilliGPU: 1000, MemoryBytes: 85899345920, Isolation: api.IsolationExclusive}}},
			{Node: "hgx-2", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "amd", MilliGPU: 500, Isolation: api.IsolationMPS}}},
		}},
	{ID: "l-stopping", Project: "nlp", User: "ana", State: api.LeaseStopping, Reason: "preempted by l-granted", CreatedAt: at(3, 7),
		GrantedAt: atp(3, 7), EndsAt: atp(3, 19), StopDeadline: atp(3, 9), GPUs: 0.25, Isolation: api.IsolationMPS, Jobs: []string{"j-assigned"},
		Request:     api.LeaseRequest{Project: "nlp", Fraction: 0.25, MemoryBytes: 20 << 30, Preemptible: true},
		Allocations: []api.Allocation{{Node: "hgx-1", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "nvidia", MilliGPU: 250, MemoryBytes: 20 << 30, Isolation: api.IsolationMPS}}}}},
	{ID: "l-done", Project: "vision", User: "bob", State: api.LeaseDone, Reason: "released by bob", CreatedAt: at(2, 8),
		GrantedAt: atp(2, 8), EndsAt: atp(2, 20), EndedAt: atp(2, 10), GPUs: 1, Jobs: []string{"j-exited", "j-failed"},
		Request:     api.LeaseRequest{Project: "vision", GPUs: 1},
		Allocations: []api.Allocation{{Node: "hgx-1", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "nvidia", MilliGPU: 1000, Isolation: api.IsolationExclusive}}}}},
	{ID: "l-cancelled", Project: "nlp", User: "ana", State: api.LeaseCancelled, Reason: "cancelled by ana", CreatedAt: at(2, 7), EndedAt: atp(2, 7),
		GPUs: 1, Jobs: []string{"j-stopped"}, Request: api.LeaseRequest{Project: "nlp", GPUs: 1, Job: &api.JobSpec{Image: "ghcr.io/lab/eval:1"}}},
	{ID: "l-refused", Project: "vision", User: "ana", State: api.LeaseRefused, Reason: "no node has 16 GPUs of one model", CreatedAt: at(2, 6),
		EndedAt: atp(2, 6), GPUs: 16, Request: api.LeaseRequest{Project: "vision", GPUs: 16}},
	{ID: "l-preempted", Project: "nlp", User: "ana", State: api.LeasePreempted, Reason: "preempted by l-done", CreatedAt: at(2, 5),
		GrantedAt: atp(2, 5), EndedAt: atp(2, 8), GPUs: 1, Request: api.LeaseRequest{Project: "nlp", MIG: "1g.10gb", Preemptible: true},
		Allocations: []api.Allocation{{Node: "hgx-1", Devices: []api.DeviceGrant{{ID: "gpu1/mig-1.0", Vendor: "nvidia", Index: 1, MilliGPU: 142, MemoryBytes: 10 << 30, Isolation: api.IsolationMIG}}}}},
	{ID: "l-expired", Project: "default", User: "admin", State: api.LeaseExpired, Reason: "time limit of 1h reached", CreatedAt: at(1, 14),
		GrantedAt: atp(1, 14), EndsAt: atp(1, 15), EndedAt: atp(1, 15), GPUs: 1,
		Request:     api.LeaseRequest{Project: "default", GPUs: 1, TimeLimitSeconds: 3600},
		Allocations: []api.Allocation{{Node: "hgx-2", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "amd", MilliGPU: 1000, Isolation: api.IsolationExclusive}}}}},
	{ID: "l-lost", Project: "vision", User: "ana", State: api.LeaseLost, Reason: "node hgx-2 stopped answering", CreatedAt: at(1, 13),
		GrantedAt: atp(1, 13), EndedAt: atp(2, 11), GPUs: 1, Holding: true, Jobs: []string{"j-lost"},
		Request:     api.LeaseRequest{Project: "vision", GPUs: 1},
		Allocations: []api.Allocation{{Node: "hgx-2", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "amd", MilliGPU: 1000, Isolation: api.IsolationExclusive}}}}},
}

// fixtureJobs are one job in every state, by id (as Jobs lists them).
var fixtureJobs = []*api.Job{
	{ID: "j-assigned", LeaseID: "l-stopping", Project: "nlp", State: api.JobAssigned, Created: at(3, 7),
		Spec:  api.JobSpec{Command: []string{"sleep", "60"}},
		Tasks: []api.Task{{Node: "hgx-1", Rank: 0, State: api.JobAssigned}}},
	{ID: "j-exited", LeaseID: "l-done", Project: "vision", State: api.JobExited, ExitCode: intp(0), Reason: "exited 0",
		Created: at(2, 8), Started: atp(2, 8), Finished: atp(2, 9),
		Spec: api.JobSpec{Command: []string{"torchrun", "--nproc", "2", "train.py"}, Env: map[string]string{"A": "1", "B": ""}, WorkDir: "/w"},
		Tasks: []api.Task{
			{Node: "hgx-1", Rank: 0, State: api.JobExited, ExitCode: intp(0), Reason: "exited 0"},
			{Node: "hgx-2", Rank: 1, State: api.JobExited, ExitCode: intp(0), Reason: "exited 0"},
		}},
	{ID: "j-failed", LeaseID: "l-done", Project: "vision", State: api.JobFailed, ExitCode: intp(127), Reason: "exec: python3: not found",
		Created: at(2, 9), Finished: atp(2, 9), Spec: api.JobSpec{Command: []string{"python3"}},
		Tasks: []api.Task{{Node: "hgx-1", State: api.JobFailed, ExitCode: intp(127), Reason: "exec: python3: not found"}}},
	{ID: "j-lost", LeaseID: "l-lost", Project: "vision", State: api.JobLost, Reason: "node hgx-2 stopped answering",
		Created: at(1, 13), Started: atp(1, 13), Finished: atp(2, 11), Spec: api.JobSpec{Image: "nvcr.io/nvidia/pytorch:24.05-py3"},
		Tasks: []api.Task{{Node: "hgx-2", State: api.JobLost, Reason: "killed by signal KILL"}}},
	{ID: "j-pending", LeaseID: "l-queued", Project: "vision", State: api.JobPending, Created: at(3, 9),
		Spec: api.JobSpec{Command: []string{"true"}}},
	{ID: "j-running", LeaseID: "l-granted", Project: "vision", State: api.JobRunning, Created: at(3, 8), Started: atp(3, 8),
		Spec:  api.JobSpec{Command: []string{"python", "train.py"}, Env: map[string]string{"EPOCHS": "3"}, WorkDir: "/srv/train"},
		Tasks: []api.Task{{Node: "hgx-1", State: api.JobRunning}, {Node: "hgx-2", Rank: 1, State: api.JobRunning}}},
	{ID: "j-stopped", LeaseID: "l-cancelled", Project: "nlp", State: api.JobStopped, Reason: "its lease was cancelled", Created: at(2, 7),
		Finished: atp(2, 7), Spec: api.JobSpec{Image: "ghcr.io/lab/eval:1"}},
}

type fixtureUse struct {
	project string
	period  time.Time
	seconds float64
}

// fixtureUsage is as stored: added in two steps, so 5400 is 3600+1800.
var fixtureUsage = []fixtureUse{
	{"vision", at(1, 0), 5400},
	{"vision", at(2, 0), 1.5},
	{"nlp", at(1, 0), 7200},
}

var fixtureEvents = []api.Event{ // by seq
	{Seq: 1, At: at(1, 8), Kind: "server.created", Subject: "server", Message: "first start"},
	{Seq: 2, At: at(1, 9), Kind: "token.created", Subject: "ana", Message: "admin made token tok-ana for ana (member)"},
	{Seq: 3, At: at(2, 8), Kind: "lease.granted", Subject: "l-done", Project: "vision", Message: "granted hgx-1:gpu0"},
	{Seq: 4, At: at(2, 10), Kind: "lease.done", Subject: "l-done", Project: "vision", Message: "done: released by bob"},
	{Seq: 5, At: at(3, 7), Kind: "lease.granted", Subject: "l-stopping", Project: "nlp", Message: "granted hgx-1:gpu0 (mps 250)"},
	{Seq: 6, At: at(3, 9), Kind: "lease.created", Subject: "l-queued", Project: "vision", Message: "ana asks for 2 GPUs"},
}

// TestMakeFixture writes testdata/v3.db with the store's write API; it
// runs only when asked:
//
//	go test ./store -run TestMakeFixture -args -write-fixture
func TestMakeFixture(t *testing.T) {
	if !*writeFixture {
		t.Skip("writes testdata/v3.db only with -write-fixture")
	}
	ctx := context.Background()
	tmp := filepath.Join(t.TempDir(), "kiln.db")
	s := open(t, tmp)
	err := s.Update(ctx, func(tx *Tx) error {
		for _, u := range fixtureUsers {
			u.Projects = nil // from the members table
			if err := tx.PutUser(u); err != nil {
				return err
			}
		}
		for _, p := range fixtureProjects {
			p.Members = nil // from the members table
			// What the server counts is not stored.
			p.HeldGPUs, p.UsedHours, p.QueuedLease = 3, 4, 5
			if p.Name == "default" {
				p.Weight, p.PeriodSeconds = 0, 0 // PutProject's defaults
			}
			if err := tx.PutProject(p); err != nil {
				return err
			}
		}
		for _, m := range fixtureMembers {
			if err := tx.AddMember(m[0], m[1]); err != nil {
				return err
			}
		}
		for _, r := range fixtureTokens {
			if err := tx.PutToken(r); err != nil {
				return err
			}
		}
		for _, r := range fixtureJoinTokens {
			if err := tx.PutJoinToken(r); err != nil {
				return err
			}
		}
		for _, id := range []string{"jt-spent", "jt-revoked"} {
			if ok, err := tx.UseJoinToken(id, at(1, 12)); err != nil || !ok {
				t.Fatalf("using %s: %v %v", id, ok, err)
			}
		}
		if err := tx.RevokeJoinToken("jt-revoked", at(2, 14)); err != nil {
			return err
		}
		for _, e := range fixtureEvents[:3] {
			if err := tx.AddEvent(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The server writes cluster state through Writes, in two group commits.
	var w1, w Writes
	for _, r := range fixtureNodes {
		if err := w1.PutNode(r); err != nil {
			t.Fatal(err)
		}
	}
	for node, ds := range fixtureDevices {
		for id, st := range ds {
			w1.PutDevice(node, id, st)
		}
	}
	w1.AddUsage("vision", at(1, 0), 3600)
	if err := s.Apply(ctx, &w1); err != nil {
		t.Fatal(err)
	}
	for _, l := range fixtureLeases {
		cp := *l
		if cp.State == api.LeaseQueued { // derived, not stored
			cp.QueuePosition, cp.EstimatedStart = 2, atp(3, 10)
		}
		if err := w.PutLease(&cp); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range fixtureJobs {
		if err := w.PutJob(j); err != nil {
			t.Fatal(err)
		}
	}
	w.AddUsage("vision", at(1, 0), 1800)
	w.AddUsage("vision", at(2, 0), 1.5)
	w.AddUsage("nlp", at(1, 0), 7200)
	for _, e := range fixtureEvents[3:] {
		w.AddEvent(e)
	}
	if err := s.Apply(ctx, &w); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(fixturePath); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	// VACUUM INTO: one compact file, no WAL beside it.
	if err := Backup(ctx, tmp, fixturePath); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", fixturePath)
}

// same fails the test when got is not want, showing both as JSON.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// openFixture opens a copy of testdata/v3.db.
func openFixture(t *testing.T) *Store {
	t.Helper()
	b, err := os.ReadFile(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kiln.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return open(t, path)
}

func leasesByID(ids ...string) []*api.Lease {
	var out []*api.Lease
	for _, id := range ids {
		for _, l := range fixtureLeases {
			if l.ID == id {
				out = append(out, l)
			}
		}
	}
	return out
}

func jobsByID(ids ...string) []*api.Job {
	var out []*api.Job
	for _, id := range ids {
		for _, j := range fixtureJobs {
			if j.ID == id {
				out = append(out, j)
			}
		}
	}
	return out
}

// TestFixture reads a database written by an earlier kiln: every read
// gives what was written then.
func TestFixture(t *testing.T) {
	ctx := context.Background()
	s := openFixture(t)
	defer s.Close()
	err := s.View(ctx, func(tx *Tx) error {
		users, err := tx.Users()
		if err != nil {
			return err
		}
		same(t, "users", users, fixtureUsers)
		u, err := tx.UserByName("ana")
		if err != nil {
			return err
		}
		same(t, "user ana", u, fixtureUsers[1])
		ps, err := tx.Projects()
		if err != nil {
			return err
		}
		same(t, "projects", ps, fixtureProjects)
		toks, err := tx.Tokens()
		if err != nil {
			return err
		}
		same(t, "tokens", toks, fixtureTokens)
		jts, err := tx.JoinTokens()
		if err != nil {
			return err
		}
		same(t, "join tokens", jts, fixtureJoinTokens)
		jt, err := tx.JoinToken("jt-revoked")
		if err != nil {
			return err
		}
		same(t, "join token jt-revoked", jt, fixtureJoinTokens[1])
		nodes, err := tx.Nodes()
		if err != nil {
			return err
		}
		same(t, "nodes", nodes, fixtureNodes)
		for node, want := range fixtureDevices {
			ds, err := tx.Devices(node)
			if err != nil {
				return err
			}
			same(t, "devices of "+node, ds, want)
		}
		ls, err := tx.Leases(LeaseFilter{})
		if err != nil {
			return err
		}
		same(t, "leases", ls, fixtureLeases)
		for _, want := range fixtureLeases {
			l, err := tx.Lease(want.ID)
			if err != nil {
				return err
			}
			same(t, "lease "+want.ID, l, want)
		}
		ls, err = tx.Leases(LeaseFilter{Projects: []string{"nlp"}, States: []string{api.LeaseStopping, api.LeasePreempted}, Limit: 1})
		if err != nil {
			return err
		}
		same(t, "stopping or preempted leases of nlp, at most 1", ls, leasesByID("l-stopping"))
		js, err := tx.Jobs()
		if err != nil {
			return err
		}
		same(t, "jobs", js, fixtureJobs)
		js, err = tx.Jobs(api.JobRunning, api.JobExited)
		if err != nil {
			return err
		}
		same(t, "running and exited jobs", js, jobsByID("j-exited", "j-running"))
		for _, want := range fixtureJobs {
			j, err := tx.Job(want.ID)
			if err != nil {
				return err
			}
			same(t, "job "+want.ID, j, want)
		}
		jp, err := tx.JobProjects()
		if err != nil {
			return err
		}
		same(t, "job projects", jp, map[string]string{"j-assigned": "nlp", "j-exited": "vision", "j-failed": "vision",
			"j-lost": "vision", "j-pending": "vision", "j-running": "vision", "j-stopped": "nlp"})
		for _, want := range fixtureUsage {
			got, err := tx.Usage(want.project, want.period)
			if err != nil {
				return err
			}
			if got != want.seconds {
				t.Errorf("usage of %s from %s: %g, want %g", want.project, want.period, got, want.seconds)
			}
		}
		evs, err := tx.Events(0, nil, 100)
		if err != nil {
			return err
		}
		same(t, "events", evs, fixtureEvents)
		evs, err = tx.Events(3, []string{"vision"}, 10)
		if err != nil {
			return err
		}
		same(t, "events of vision after 3", evs, []api.Event{fixtureEvents[3], fixtureEvents[5]})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if users, nodes, err := s.Counts(ctx); err != nil || users != 3 || nodes != 2 {
		t.Errorf("counts: %d users, %d nodes (%v), want 3 and 2", users, nodes, err)
	}
}

// TestFixtureRowsAsWritten writes the fixture's values into a new database
// and compares what is stored with the old database: the same columns and
// the same JSON, so a database is the same whichever kiln wrote it.
func TestFixtureRowsAsWritten(t *testing.T) {
	ctx := context.Background()
	old := openFixture(t)
	defer old.Close()
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	err := s.Update(ctx, func(tx *Tx) error {
		for _, p := range fixtureProjects {
			if err := tx.PutProject(p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var w Writes
	for _, r := range fixtureNodes {
		if err := w.PutNode(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range fixtureLeases {
		if err := w.PutLease(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range fixtureJobs {
		if err := w.PutJob(j); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Apply(ctx, &w); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT name, weight || ' ' || max_gpus || ' ' || gpu_hours || ' ' || period_s, limits FROM projects ORDER BY name`,
		`SELECT id, cert_sha256 || ' ' || state, data FROM nodes ORDER BY id`,
		`SELECT id, project || ' ' || state || ' ' || created_at, data FROM leases ORDER BY id`,
		`SELECT id, lease_id || ' ' || state, data FROM jobs ORDER BY id`,
	} {
		want, got := rawRows(t, old, q), rawRows(t, s, q)
		if len(got) != len(want) {
			t.Errorf("%s: %d rows, want %d", q, len(got), len(want))
		}
		for k, w := range want {
			g, ok := got[k]
			if !ok {
				t.Errorf("%s: no row %s", q, k)
				continue
			}
			if g[0] != w[0] {
				t.Errorf("%s: row %s has columns %q, want %q", q, k, g[0], w[0])
			}
			var gj, wj any
			if err := json.Unmarshal([]byte(g[1]), &gj); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(w[1]), &wj); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gj, wj) {
				t.Errorf("%s: row %s is stored as\n%s\nwant\n%s", q, k, g[1], w[1])
			}
		}
	}
}

// rawRows runs a query of three text columns: key, columns, JSON.
func rawRows(t *testing.T, s *Store, q string) map[string][2]string {
	t.Helper()
	rows, err := s.rdb.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][2]string{}
	for rows.Next() {
		var k, cols, data string
		if err := rows.Scan(&k, &cols, &data); err != nil {
			t.Fatal(err)
		}
		out[k] = [2]string{cols, data}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFixtureWritable changes a database written by an earlier kiln, with
// both Update and Apply, and reads the changes back.
func TestFixtureWritable(t *testing.T) {
	ctx := context.Background()
	s := openFixture(t)
	defer s.Close()
	err := s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutUser(api.User{ID: "u-cy", Name: "cy", Role: api.RoleMember, Created: at(4, 9)}); err != nil {
			return err
		}
		if err := tx.AddMember("nlp", "u-cy"); err != nil {
			return err
		}
		if err := tx.PutProject(api.Project{Name: "nlp", Weight: 3, PeriodSeconds: 3600, Limits: api.Limits{MaxEnvBytes: 10}}); err != nil {
			return err
		}
		if err := tx.DeleteToken("tok-bob"); err != nil {
			return err
		}
		if err := tx.PutToken(TokenRow{ID: "tok-cy", UserID: "u-cy", Hash: []byte("cy"), Created: at(4, 9)}); err != nil {
			return err
		}
		if ok, err := tx.UseJoinToken("jt-fresh", at(3, 12)); err != nil || !ok {
			t.Errorf("join token jt-fresh: %v %v, want a use", ok, err)
		}
		if ok, err := tx.UseJoinToken("jt-spent", at(1, 12)); err != nil || ok {
			t.Errorf("join token jt-spent: %v %v, want none: used up", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	granted := *fixtureLeases[0]
	granted.State, granted.GrantedAt = api.LeaseGranted, atp(4, 10)
	granted.Allocations = []api.Allocation{{Node: "hgx-2", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "amd", MilliGPU: 1000, Isolation: api.IsolationExclusive}}}}
	assigned := *fixtureJobs[4]
	assigned.State = api.JobAssigned
	assigned.Tasks = []api.Task{{Node: "hgx-2", State: api.JobAssigned}}
	back := fixtureNodes[1]
	back.Node.State, back.Node.LastSeen, back.Replacing = api.NodeReady, at(4, 9), false
	var w Writes
	if err := w.PutNode(back); err != nil {
		t.Fatal(err)
	}
	if err := w.PutLease(&granted); err != nil {
		t.Fatal(err)
	}
	if err := w.PutJob(&assigned); err != nil {
		t.Fatal(err)
	}
	w.PutDevice("hgx-2", "gpu0", DeviceState{})
	w.AddUsage("vision", at(1, 0), 600)
	w.AddEvent(api.Event{At: at(4, 10), Kind: "lease.granted", Subject: "l-queued", Project: "vision", Message: "granted hgx-2:gpu0"})
	if err := s.Apply(ctx, &w); err != nil {
		t.Fatal(err)
	}
	err = s.View(ctx, func(tx *Tx) error {
		u, err := tx.UserByName("cy")
		if err != nil {
			return err
		}
		same(t, "user cy", u, api.User{ID: "u-cy", Name: "cy", Role: api.RoleMember, Projects: []string{"nlp"}, Created: at(4, 9)})
		ps, err := tx.Projects()
		if err != nil {
			return err
		}
		same(t, "project nlp", ps[1], api.Project{Name: "nlp", Weight: 3, PeriodSeconds: 3600, Members: []string{"ana", "cy"}, Limits: api.Limits{MaxEnvBytes: 10}})
		toks, err := tx.Tokens()
		if err != nil {
			return err
		}
		same(t, "tokens", toks, []TokenRow{fixtureTokens[0], fixtureTokens[1], {ID: "tok-cy", UserID: "u-cy", Hash: []byte("cy"), Created: at(4, 9)}})
		jt, err := tx.JoinToken("jt-fresh")
		if err != nil {
			return err
		}
		if jt.Used != 1 {
			t.Errorf("join token jt-fresh used %d times, want 1", jt.Used)
		}
		nodes, err := tx.Nodes()
		if err != nil {
			return err
		}
		same(t, "nodes", nodes, []NodeRecord{fixtureNodes[0], back})
		ds, err := tx.Devices("hgx-2")
		if err != nil {
			return err
		}
		same(t, "devices of hgx-2", ds, map[string]DeviceState{"gpu0": {}})
		l, err := tx.Lease("l-queued")
		if err != nil {
			return err
		}
		same(t, "lease l-queued", l, &granted)
		ls, err := tx.Leases(LeaseFilter{States: []string{api.LeaseGranted}})
		if err != nil {
			return err
		}
		same(t, "granted leases", ls, []*api.Lease{&granted, fixtureLeases[1]})
		j, err := tx.Job("j-pending")
		if err != nil {
			return err
		}
		same(t, "job j-pending", j, &assigned)
		use, err := tx.Usage("vision", at(1, 0))
		if err != nil {
			return err
		}
		if use != 6000 {
			t.Errorf("usage of vision %g, want 6000", use)
		}
		evs, err := tx.Events(6, nil, 10)
		if err != nil {
			return err
		}
		same(t, "events after 6", evs, []api.Event{{Seq: 7, At: at(4, 10), Kind: "lease.granted", Subject: "l-queued", Project: "vision", Message: "granted hgx-2:gpu0"}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
