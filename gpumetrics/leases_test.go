package gpumetrics

import (
	"testing"

	"kiln.dev/kiln/snapshot"
)

func proc(pid int, mem uint64) snapshot.GPUProcess {
	return snapshot.GPUProcess{PID: pid, MemoryBytes: snapshot.Ptr(mem)}
}

func onMIG(p snapshot.GPUProcess, gi, ci int) snapshot.GPUProcess {
	p.GPUInstance, p.ComputeInstance = snapshot.Ptr(gi), snapshot.Ptr(ci)
	return p
}

func withSM(p snapshot.GPUProcess, pct float64) snapshot.GPUProcess {
	p.SMPercent = snapshot.Ptr(pct)
	return p
}

const gib = 1 << 30

// TestAttribute is the attribution table: processes to leases through
// cgroup trees, MIG routing, MPS and time-slice sums, the unattributed
// remainder, and lease memory never above what the GPU reports.
func TestAttribute(t *testing.T) {
	leases := []Lease{
		{ID: "l-a", Project: "vision", User: "ana", Cgroups: []string{"/kiln/job-j1"}},
		{ID: "l-b", Project: "nlp", User: "bo", Cgroups: []string{"/kiln/job-j2", "/kiln/job-j3/"}},
		// A lease whose job cgroup nests in another's is the deeper one's.
		{ID: "l-c", Project: "nlp", User: "bo", Cgroups: []string{"/kiln/job-j1/inner"}},
		{ID: "l-root", Cgroups: []string{"/"}}, // never matches everything
	}
	cgroups := map[int]string{
		11: "/kiln/job-j1", 12: "/kiln/job-j1/worker", 13: "/kiln/job-j1/inner/x",
		21: "/kiln/job-j2", 31: "/kiln/job-j3/a/b",
		41: "/kiln/job-j10", // not job-j1's: a path boundary, not a prefix
		51: "/user.slice/foreign",
	}
	tests := []struct {
		name     string
		gpu      snapshot.GPU
		want     map[[2]string][2]uint64 // lease, instance -> processes, memory
		wantRest [2]uint64               // processes, memory
		wantSM   map[string]float64
	}{
		{
			name: "cgroup tree and foreign processes",
			gpu: snapshot.GPU{Index: 0, UUID: "GPU-0", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 20 * gib,
				ProcessList: []snapshot.GPUProcess{proc(11, 4*gib), proc(12, 2*gib), proc(13, 1*gib), proc(41, 3*gib), proc(51, 5*gib), proc(99, 1*gib)}},
			want:     map[[2]string][2]uint64{{"l-a", ""}: {2, 6 * gib}, {"l-c", ""}: {1, 1 * gib}},
			wantRest: [2]uint64{3, 13 * gib}, // 41, 51 and 99 (no cgroup known), and the driver's 4 GiB
		},
		{
			name: "MIG instances route by instance",
			gpu: snapshot.GPU{Index: 1, UUID: "GPU-1", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 30 * gib,
				ProcessList: []snapshot.GPUProcess{onMIG(proc(11, 10*gib), 3, 0), onMIG(proc(21, 8*gib), 5, 0), onMIG(proc(31, 2*gib), 5, 0)}},
			want:     map[[2]string][2]uint64{{"l-a", "3/0"}: {1, 10 * gib}, {"l-b", "5/0"}: {2, 10 * gib}},
			wantRest: [2]uint64{0, 10 * gib},
		},
		{
			name: "MPS and time slices add up",
			gpu: snapshot.GPU{Index: 2, UUID: "GPU-2", MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 12 * gib,
				ProcessList: []snapshot.GPUProcess{withSM(proc(11, 3*gib), 30), withSM(proc(21, 4*gib), 25), withSM(proc(31, 4*gib), 20)}},
			want:     map[[2]string][2]uint64{{"l-a", ""}: {1, 3 * gib}, {"l-b", ""}: {2, 8 * gib}},
			wantRest: [2]uint64{0, 1 * gib},
			wantSM:   map[string]float64{"l-a": 30, "l-b": 45},
		},
		{
			name: "per-process figures above the GPU's are scaled down",
			gpu: snapshot.GPU{Index: 3, UUID: "GPU-3", MemoryTotalBytes: 16 * gib, MemoryUsedBytes: 10 * gib,
				ProcessList: []snapshot.GPUProcess{proc(11, 10*gib), proc(21, 10*gib)}},
			want:     map[[2]string][2]uint64{{"l-a", ""}: {1, 5 * gib}, {"l-b", ""}: {1, 5 * gib}},
			wantRest: [2]uint64{0, 0},
		},
		{
			name: "a used figure above the GPU's size is held to the size",
			gpu: snapshot.GPU{Index: 4, UUID: "GPU-4", MemoryTotalBytes: 8 * gib, MemoryUsedBytes: 9 * gib,
				ProcessList: []snapshot.GPUProcess{proc(11, 9*gib)}},
			want:     map[[2]string][2]uint64{{"l-a", ""}: {1, 8 * gib}},
			wantRest: [2]uint64{0, 0},
		},
		{
			name: "memory the driver does not say",
			gpu: snapshot.GPU{Index: 5, UUID: "GPU-5", MemoryTotalBytes: 8 * gib, MemoryUsedBytes: 2 * gib,
				ProcessList: []snapshot.GPUProcess{{PID: 11}}},
			want:     map[[2]string][2]uint64{{"l-a", ""}: {1, 0}},
			wantRest: [2]uint64{0, 2 * gib},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &snapshot.Snapshot{GPUs: []snapshot.GPU{tc.gpu}}
			uses, rests := Attribute(s, leases, cgroups)
			got := map[[2]string][2]uint64{}
			var sum uint64
			for _, u := range uses {
				got[[2]string{u.Lease, u.Instance}] = [2]uint64{uint64(u.Processes), u.MemoryBytes}
				sum += u.MemoryBytes
				if u.MemoryBytes > tc.gpu.MemoryTotalBytes {
					t.Errorf("lease %s uses %d bytes of a %d-byte GPU", u.Lease, u.MemoryBytes, tc.gpu.MemoryTotalBytes)
				}
				if want, ok := tc.wantSM[u.Lease]; ok && (u.SMPercent == nil || *u.SMPercent != want) {
					t.Errorf("lease %s SM %v, want %g", u.Lease, u.SMPercent, want)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("uses %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("lease %s instance %q: processes, memory = %v, want %v", k[0], k[1], got[k], w)
				}
			}
			if len(rests) != 1 {
				t.Fatalf("rests %+v", rests)
			}
			r := rests[0]
			if [2]uint64{uint64(r.Processes), r.MemoryBytes} != tc.wantRest {
				t.Errorf("rest: processes, memory = %d, %d, want %v", r.Processes, r.MemoryBytes, tc.wantRest)
			}
			// The leases and the rest add up to what the GPU has in use.
			if used := min(tc.gpu.MemoryUsedBytes, tc.gpu.MemoryTotalBytes); sum+r.MemoryBytes != used {
				t.Errorf("leases %d + rest %d != used %d", sum, r.MemoryBytes, used)
			}
		})
	}
}

// TestLeaseSeriesNotOnDevices: the lease's project and user are on
// kiln_lease_info only, and the device series carry no lease label.
func TestLeaseSeriesNotOnDevices(t *testing.T) {
	s := &snapshot.Snapshot{GPUs: []snapshot.GPU{{Index: 0, UUID: "GPU-0", Vendor: snapshot.VendorNVIDIA, MemoryTotalBytes: 8 * gib, MemoryUsedBytes: 3 * gib,
		UtilizationGPU: snapshot.Ptr(50.0), ProcessList: []snapshot.GPUProcess{proc(11, 2*gib), proc(21, 1*gib)}, Processes: 2}}}
	in := Input{Snapshot: s, Leases: []Lease{{ID: "l-a", Project: "p", User: "u", Cgroups: []string{"/kiln/job-j1"}}, {ID: "l-b", Project: "q", User: "v", Cgroups: []string{"/kiln/job-j2"}}},
		Cgroups: map[int]string{11: "/kiln/job-j1", 21: "/kiln/job-j2"}}
	fams := Families(in, Options{DCGM: true})
	seen := map[string]bool{}
	for _, f := range fams {
		seen[f.Name] = true
		hasLease, hasUser := false, false
		for _, l := range f.Labels {
			hasLease = hasLease || l == "lease"
			hasUser = hasUser || l == "user" || l == "project"
		}
		if hasUser && f.Name != "kiln_lease_info" {
			t.Errorf("%s has project or user labels: only kiln_lease_info may", f.Name)
		}
		if hasLease && !(f.Name == "kiln_lease_info" || len(f.Name) > len("kiln_lease_") && f.Name[:len("kiln_lease_")] == "kiln_lease_") {
			t.Errorf("%s, a device series, has a lease label", f.Name)
		}
		if f.Name == "kiln_lease_gpu_memory_used_bytes" && len(f.Series) != 2 {
			t.Errorf("%s: %d series, want one per lease", f.Name, len(f.Series))
		}
	}
	for _, n := range []string{"kiln_lease_info", "kiln_lease_gpu_memory_used_bytes", "kiln_gpu_unattributed_memory_bytes"} {
		if !seen[n] {
			t.Errorf("no %s", n)
		}
	}
}

// FuzzAttribute holds the attribution's invariants on any processes and
// cgroup paths: leases and the rest add up to what the GPU has in use (at
// most its size), no lease holds more than the GPU, and every process is
// counted once.
func FuzzAttribute(f *testing.F) {
	f.Add(uint64(80*gib), uint64(20*gib), "/kiln/job-j1", "/kiln/job-j1/x", uint64(4*gib), uint64(30*gib), true)
	f.Add(uint64(8*gib), uint64(9*gib), "/", "/kiln/job-j10", uint64(9*gib), uint64(0), false)
	f.Add(uint64(0), uint64(0), "", "", uint64(1), uint64(1), true)
	f.Add(uint64(80*gib), uint64(80*gib), "/kiln/job-j1", "/kiln/job-j1", ^uint64(0), ^uint64(0)-5, false) // sums that would wrap
	f.Fuzz(func(t *testing.T, total, used uint64, lease, proc string, m1, m2 uint64, mig bool) {
		p1 := snapshot.GPUProcess{PID: 1, MemoryBytes: &m1}
		p2 := snapshot.GPUProcess{PID: 2, MemoryBytes: &m2}
		if mig {
			p2 = onMIG(p2, 1, 0)
		}
		s := &snapshot.Snapshot{GPUs: []snapshot.GPU{{MemoryTotalBytes: total, MemoryUsedBytes: used, ProcessList: []snapshot.GPUProcess{p1, p2}}}}
		uses, rests := Attribute(s, []Lease{{ID: "l", Cgroups: []string{lease}}}, map[int]string{1: proc, 2: lease})
		var sum uint64
		procs := 0
		for _, u := range uses {
			sum += u.MemoryBytes
			procs += u.Processes
			if total > 0 && u.MemoryBytes > total {
				t.Fatalf("a lease holds %d bytes of a %d-byte GPU", u.MemoryBytes, total)
			}
		}
		if len(rests) != 1 {
			t.Fatalf("rests %+v", rests)
		}
		if procs+rests[0].Processes != 2 {
			t.Fatalf("%d processes counted, want 2", procs+rests[0].Processes)
		}
		if total > 0 {
			if want := min(used, total); sum+rests[0].MemoryBytes != want {
				t.Fatalf("leases %d + rest %d != used %d", sum, rests[0].MemoryBytes, want)
			}
		}
	})
}
