package gpumetrics

import (
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Lease is a lease whose jobs run on the node, as the agent started them.
type Lease struct {
	ID, Project, User string
	// Cgroups are the cgroup v2 paths of its jobs ("/kiln/job-j1"): a
	// process in one of them, or below, is the lease's.
	Cgroups []string
}

// Use is what one lease uses of one GPU or MIG instance in a sample.
type Use struct {
	Lease string
	GPU   int // the GPU's index
	UUID  string
	// Instance is the MIG instance ("3/0": GPU instance 3, compute
	// instance 0); empty on a whole GPU.
	Instance    string
	Processes   int
	MemoryBytes uint64
	// SMPercent sums the SM use of its processes where the driver samples
	// processes; nil where it samples none of them.
	SMPercent *float64
}

// Rest is what no lease accounts for on a GPU: driver overhead and
// processes kiln did not start.
type Rest struct {
	GPU         int
	UUID        string
	Processes   int
	MemoryBytes uint64
}

// Attribute divides each GPU's processes between the leases by the cgroup
// of each process (cgroups: PID to cgroup path, as /proc/PID/cgroup says).
// A process whose cgroup is unknown, or in no lease's, is the rest's. The
// memory of a GPU's leases never exceeds what the GPU reports in use, nor
// its size: where the driver's per-process figures add up to more, the
// leases' shares are scaled down to it. Uses come sorted by lease, GPU and
// instance.
func Attribute(s *snapshot.Snapshot, leases []Lease, cgroups map[int]string) ([]Use, []Rest) {
	var uses []Use
	var rests []Rest
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if len(g.ProcessList) == 0 && g.MemoryTotalBytes == 0 {
			continue
		}
		per := map[[2]string]*Use{}
		rest := Rest{GPU: g.Index, UUID: g.UUID}
		var leased uint64
		for _, p := range g.ProcessList {
			id := leaseOf(leases, cgroups[p.PID])
			if id == "" {
				rest.Processes++
				continue
			}
			inst := ""
			if p.GPUInstance != nil && p.ComputeInstance != nil {
				inst = strconv.Itoa(*p.GPUInstance) + "/" + strconv.Itoa(*p.ComputeInstance)
			}
			k := [2]string{id, inst}
			u := per[k]
			if u == nil {
				u = &Use{Lease: id, GPU: g.Index, UUID: g.UUID, Instance: inst}
				per[k] = u
			}
			u.Processes++
			if p.MemoryBytes != nil {
				m := *p.MemoryBytes
				if g.MemoryTotalBytes > 0 {
					m = min(m, g.MemoryTotalBytes) // no process holds more than the GPU
				}
				u.MemoryBytes = addSat(u.MemoryBytes, m)
				leased = addSat(leased, m)
			}
			if p.SMPercent != nil {
				v := *p.SMPercent
				if u.SMPercent != nil {
					v += *u.SMPercent
				}
				u.SMPercent = &v
			}
		}
		used := g.MemoryUsedBytes
		if g.MemoryTotalBytes > 0 && used > g.MemoryTotalBytes {
			used = g.MemoryTotalBytes
		}
		if used == 0 && g.MemoryTotalBytes == 0 {
			used = leased // the GPU does not say: trust the processes
		}
		if leased > used {
			// The per-process figures add up to more than the GPU says is
			// used (they are sampled at other moments): scale them down.
			var sum uint64
			for _, u := range per {
				u.MemoryBytes = uint64(float64(u.MemoryBytes) * float64(used) / float64(leased))
				sum += u.MemoryBytes
			}
			leased = sum
		}
		rest.MemoryBytes = used - leased
		for _, u := range per {
			uses = append(uses, *u)
		}
		rests = append(rests, rest)
	}
	sort.Slice(uses, func(i, j int) bool {
		a, b := uses[i], uses[j]
		if a.Lease != b.Lease {
			return a.Lease < b.Lease
		}
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		return a.Instance < b.Instance
	})
	return uses, rests
}

// addSat adds without wrapping around.
func addSat(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// leaseOf is the lease whose job cgroup holds path (the deepest match), or
// "".
func leaseOf(leases []Lease, path string) string {
	if path == "" {
		return ""
	}
	best, depth := "", -1
	for _, l := range leases {
		for _, c := range l.Cgroups {
			c = strings.TrimSuffix(c, "/")
			if c == "" || c == "/" {
				continue // the root holds every process
			}
			if path == c || strings.HasPrefix(path, c+"/") {
				if len(c) > depth {
					best, depth = l.ID, len(c)
				}
			}
		}
	}
	return best
}

// leases adds the per-lease families.
func (b *builder) leases(s *snapshot.Snapshot, leases []Lease, cgroups map[int]string) {
	info := b.family("kiln_lease_info", Gauge, "A lease whose jobs run on the node (1), with its project and user: join on lease for the per-lease series.",
		"lease", "project", "user")
	for _, l := range leases {
		info.add(1, l.ID, l.Project, l.User)
	}
	uses, rests := Attribute(s, leases, cgroups)
	labels := []string{"lease", "gpu", "uuid", "mig_instance"}
	mem := b.family("kiln_lease_gpu_memory_used_bytes", Gauge, "GPU memory a lease's processes use, by GPU and MIG instance.", labels...)
	procs := b.family("kiln_lease_gpu_processes", Gauge, "A lease's processes on a GPU or MIG instance.", labels...)
	sm := b.family("kiln_lease_gpu_sm_utilization_ratio", Gauge, "Share of a GPU's SM time a lease's processes used, where the driver samples processes (not under MIG).", labels...)
	for _, u := range uses {
		lv := []string{u.Lease, strconv.Itoa(u.GPU), u.UUID, u.Instance}
		mem.add(float64(u.MemoryBytes), lv...)
		procs.add(float64(u.Processes), lv...)
		if u.SMPercent != nil {
			sm.add(min(*u.SMPercent, 100)/100, lv...)
		}
	}
	rmem := b.family("kiln_gpu_unattributed_memory_bytes", Gauge, "GPU memory in use that no lease accounts for: the driver's own and processes kiln did not start.", gpuLabels...)
	rprocs := b.family("kiln_gpu_unattributed_processes", Gauge, "Processes on the GPU that no lease accounts for.", gpuLabels...)
	for _, r := range rests {
		lv := []string{strconv.Itoa(r.GPU), r.UUID}
		rmem.add(float64(r.MemoryBytes), lv...)
		rprocs.add(float64(r.Processes), lv...)
	}
}
