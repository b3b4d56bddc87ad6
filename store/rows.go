package store

import (
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// The rows below are what the store keeps as JSON: leases.data, jobs.data,
// nodes.data and projects.limits. They are the store's own types with the
// store's own JSON names, mapped to and from package api field by field,
// so that a change of the API's wire names is no change of the databases
// in use: renaming an API field only changes the mapping. A stored name is
// changed only with a migration that rewrites the rows.
//
// A node's snapshot is kept as package snapshot encodes it: that is a
// document of its own, with its own schema version.

// leaseRow is a lease (leases.data). The queue position and the estimated
// start are derived and not stored.
type leaseRow struct {
	ID           string          `json:"id"`
	Project      string          `json:"project"`
	User         string          `json:"user"`
	State        string          `json:"state"`
	Reason       string          `json:"reason,omitempty"`
	Request      leaseRequestRow `json:"request"`
	Allocations  []allocationRow `json:"allocations,omitempty"`
	Isolation    string          `json:"isolation,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	GrantedAt    *time.Time      `json:"granted_at,omitempty"`
	EndsAt       *time.Time      `json:"ends_at,omitempty"`
	EndedAt      *time.Time      `json:"ended_at,omitempty"`
	StopDeadline *time.Time      `json:"stop_deadline,omitempty"`
	Jobs         []string        `json:"jobs,omitempty"`
	GPUs         float64         `json:"gpus_equivalent"`
	Holding      bool            `json:"holding,omitempty"`
}

type leaseRequestRow struct {
	Project          string         `json:"project"`
	Name             string         `json:"name,omitempty"`
	GPUs             int            `json:"gpus,omitempty"`
	Fraction         float64        `json:"fraction,omitempty"`
	MemoryBytes      uint64         `json:"memory_bytes,omitempty"`
	MIG              string         `json:"mig,omitempty"`
	Constraints      constraintsRow `json:"constraints,omitzero"`
	TimeLimitSeconds int            `json:"time_limit_s,omitempty"`
	Priority         int            `json:"priority,omitempty"`
	Preemptible      bool           `json:"preemptible,omitempty"`
	Job              *jobSpecRow    `json:"job,omitempty"`
	Require          []string       `json:"require,omitempty"`
	Resources        resourcesRow   `json:"resources,omitzero"`
	Placement        string         `json:"placement,omitempty"`
	Serve            *serveSpecRow  `json:"serve,omitempty"`
}

type serveSpecRow struct {
	Model  string `json:"model"`
	Engine string `json:"engine,omitempty"`
	Port   int    `json:"port"`
	Ready  string `json:"ready"`
	Source string `json:"source,omitempty"`
}

type constraintsRow struct {
	Vendor               string   `json:"vendor,omitempty"`
	Model                string   `json:"model,omitempty"`
	Architecture         string   `json:"architecture,omitempty"`
	MinMemoryBytes       uint64   `json:"min_memory_bytes,omitempty"`
	MinComputeCapability string   `json:"min_compute_capability,omitempty"`
	MinDriver            string   `json:"min_driver,omitempty"`
	MinCUDA              string   `json:"min_cuda,omitempty"`
	SameNVLinkIsland     bool     `json:"same_nvlink_island,omitempty"`
	SameNUMA             bool     `json:"same_numa,omitempty"`
	Gang                 bool     `json:"gang,omitempty"`
	Nodes                []string `json:"nodes,omitempty"`
}

type resourcesRow struct {
	CPUMilli    int    `json:"cpu_milli,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
}

type jobSpecRow struct {
	Command []string          `json:"command,omitempty"`
	Image   string            `json:"image,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	WorkDir string            `json:"workdir,omitempty"`
	Ports   []int             `json:"ports,omitempty"`
	Model   *jobModelRow      `json:"model,omitempty"`
}

type jobModelRow struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

type allocationRow struct {
	Node    string           `json:"node"`
	Devices []deviceGrantRow `json:"devices"`
	Sandbox *sandboxRow      `json:"sandbox,omitempty"`
	Choose  int              `json:"choose,omitempty"`
}

type deviceGrantRow struct {
	ID          string `json:"id"`
	Vendor      string `json:"vendor"`
	Index       int    `json:"index"`
	PCIAddress  string `json:"pci_address,omitempty"`
	UUID        string `json:"uuid,omitempty"`
	Model       string `json:"model,omitempty"`
	MilliGPU    int    `json:"milli_gpu"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	Isolation   string `json:"isolation"`
}

type sandboxRow struct {
	User           string   `json:"user"`
	OwnUser        bool     `json:"own_user"`
	PIDNamespace   bool     `json:"pid_namespace"`
	MountNamespace bool     `json:"mount_namespace"`
	PrivateTmp     bool     `json:"private_tmp"`
	CleanEnv       bool     `json:"clean_env"`
	NoNewPrivs     bool     `json:"no_new_privileges"`
	Cgroup         bool     `json:"cgroup"`
	Devices        bool     `json:"devices"`
	Missing        []string `json:"missing,omitempty"`
}

// jobRow is a job (jobs.data). JobProjects reads its "project" in SQL.
type jobRow struct {
	ID       string     `json:"id"`
	LeaseID  string     `json:"lease_id"`
	Project  string     `json:"project"`
	State    string     `json:"state"`
	Spec     jobSpecRow `json:"spec"`
	Tasks    []taskRow  `json:"tasks,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	Created  time.Time  `json:"created_at"`
	Started  *time.Time `json:"started_at,omitempty"`
	Finished *time.Time `json:"finished_at,omitempty"`
}

type taskRow struct {
	Node     string     `json:"node"`
	Rank     int        `json:"rank"`
	State    string     `json:"state"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	Open     []int      `json:"open_ports,omitempty"`
	GPU      *gpuUseRow `json:"gpu,omitempty"`
}

type gpuUseRow struct {
	PeakMemoryBytes uint64   `json:"peak_memory_bytes"`
	MeanSMPercent   *float64 `json:"mean_sm_percent,omitempty"`
	Samples         int      `json:"samples"`
	SampleSeconds   float64  `json:"sample_s"`
}

// nodeRow is a NodeRecord (nodes.data).
type nodeRow struct {
	Node       nodeInfoRow        `json:"node"`
	Snapshot   *snapshot.Snapshot `json:"snapshot,omitempty"`
	CertSHA256 string             `json:"cert_sha256"`
	KeySHA256  string             `json:"key_sha256,omitempty"`
	Replacing  bool               `json:"replacing,omitempty"`
}

type nodeInfoRow struct {
	ID           string       `json:"id"`
	State        string       `json:"state"`
	LastSeen     time.Time    `json:"last_seen"`
	Hostname     string       `json:"hostname,omitempty"`
	Recorded     bool         `json:"recorded,omitempty"`
	Executor     string       `json:"executor,omitempty"`
	Containers   string       `json:"containers,omitempty"`
	NoContainers string       `json:"no_containers,omitempty"`
	Driver       string       `json:"driver,omitempty"`
	CUDA         string       `json:"cuda,omitempty"`
	Sandbox      *sandboxRow  `json:"sandbox,omitempty"`
	Devices      []deviceRow  `json:"devices"`
	Findings     []findingRow `json:"findings,omitempty"`
	Joined       time.Time    `json:"joined_at"`
	Free         float64      `json:"free_gpus"`
	Total        int          `json:"total_gpus"`
}

type deviceRow struct {
	ID                string   `json:"id"`
	Vendor            string   `json:"vendor"`
	Index             int      `json:"index"`
	Model             string   `json:"model,omitempty"`
	Architecture      string   `json:"architecture,omitempty"`
	ComputeCapability string   `json:"compute_capability,omitempty"`
	PCIAddress        string   `json:"pci_address,omitempty"`
	UUID              string   `json:"uuid,omitempty"`
	MemoryBytes       uint64   `json:"memory_bytes,omitempty"`
	NUMANode          *int     `json:"numa_node,omitempty"`
	Island            string   `json:"island,omitempty"`
	MIGProfile        string   `json:"mig_profile,omitempty"`
	Parent            string   `json:"parent,omitempty"`
	MIGMode           bool     `json:"mig_mode,omitempty"`
	Isolation         string   `json:"isolation"`
	Drained           bool     `json:"drained,omitempty"`
	DrainReason       string   `json:"drain_reason,omitempty"`
	UsedMilli         int      `json:"used_milli"`
	Leases            []string `json:"leases,omitempty"`
	Held              bool     `json:"held,omitempty"`
}

type findingRow struct {
	ID       string   `json:"id"`
	Severity string   `json:"severity"`
	Title    string   `json:"title"`
	Devices  []string `json:"devices,omitempty"`
	Remedy   string   `json:"remedy,omitempty"`
}

// limitsRow is a project's limits (projects.limits).
type limitsRow struct {
	MaxQueued         int   `json:"max_queued,omitempty"`
	MaxQueuedPerUser  int   `json:"max_queued_per_user,omitempty"`
	MaxJobsPerLease   int   `json:"max_jobs_per_lease,omitempty"`
	MaxEnvBytes       int   `json:"max_env_bytes,omitempty"`
	MaxLogBytesPerJob int64 `json:"max_log_bytes_per_job,omitempty"`
	MaxLogBytes       int64 `json:"max_log_bytes,omitempty"`
}

// mapSlice maps every element; nil stays nil, so that what is stored is
// what was given (null or [] alike).
func mapSlice[A, B any](in []A, f func(A) B) []B {
	if in == nil {
		return nil
	}
	out := make([]B, len(in))
	for i, a := range in {
		out[i] = f(a)
	}
	return out
}

// mapPtr maps what p points to; nil stays nil.
func mapPtr[A, B any](p *A, f func(A) B) *B {
	if p == nil {
		return nil
	}
	b := f(*p)
	return &b
}

func leaseToRow(l *api.Lease) leaseRow {
	return leaseRow{
		ID:           l.ID,
		Project:      l.Project,
		User:         l.User,
		State:        l.State,
		Reason:       l.Reason,
		Request:      leaseRequestToRow(l.Request),
		Allocations:  mapSlice(l.Allocations, allocationToRow),
		Isolation:    l.Isolation,
		CreatedAt:    l.CreatedAt,
		GrantedAt:    l.GrantedAt,
		EndsAt:       l.EndsAt,
		EndedAt:      l.EndedAt,
		StopDeadline: l.StopDeadline,
		Jobs:         l.Jobs,
		GPUs:         l.GPUs,
		Holding:      l.Holding,
	}
}

func leaseFromRow(r leaseRow) *api.Lease {
	return &api.Lease{
		ID:           r.ID,
		Project:      r.Project,
		User:         r.User,
		State:        r.State,
		Reason:       r.Reason,
		Request:      leaseRequestFromRow(r.Request),
		Allocations:  mapSlice(r.Allocations, allocationFromRow),
		Isolation:    r.Isolation,
		CreatedAt:    r.CreatedAt,
		GrantedAt:    r.GrantedAt,
		EndsAt:       r.EndsAt,
		EndedAt:      r.EndedAt,
		StopDeadline: r.StopDeadline,
		Jobs:         r.Jobs,
		GPUs:         r.GPUs,
		Holding:      r.Holding,
	}
}

func leaseRequestToRow(q api.LeaseRequest) leaseRequestRow {
	return leaseRequestRow{
		Project:          q.Project,
		Name:             q.Name,
		GPUs:             q.GPUs,
		Fraction:         q.Fraction,
		MemoryBytes:      q.MemoryBytes,
		MIG:              q.MIG,
		Constraints:      constraintsToRow(q.Constraints),
		TimeLimitSeconds: q.TimeLimitSeconds,
		Priority:         q.Priority,
		Preemptible:      q.Preemptible,
		Job:              mapPtr(q.Job, jobSpecToRow),
		Require:          q.Require,
		Resources:        resourcesRow{CPUMilli: q.Resources.CPUMilli, MemoryBytes: q.Resources.MemoryBytes},
		Placement:        q.Placement,
		Serve: mapPtr(q.Serve, func(v api.ServeSpec) serveSpecRow {
			return serveSpecRow{Model: v.Model, Engine: v.Engine, Port: v.Port, Ready: v.Ready, Source: v.Source}
		}),
	}
}

func leaseRequestFromRow(r leaseRequestRow) api.LeaseRequest {
	return api.LeaseRequest{
		Project:          r.Project,
		Name:             r.Name,
		GPUs:             r.GPUs,
		Fraction:         r.Fraction,
		MemoryBytes:      r.MemoryBytes,
		MIG:              r.MIG,
		Constraints:      constraintsFromRow(r.Constraints),
		TimeLimitSeconds: r.TimeLimitSeconds,
		Priority:         r.Priority,
		Preemptible:      r.Preemptible,
		Job:              mapPtr(r.Job, jobSpecFromRow),
		Require:          r.Require,
		Resources:        api.Resources{CPUMilli: r.Resources.CPUMilli, MemoryBytes: r.Resources.MemoryBytes},
		Placement:        r.Placement,
		Serve: mapPtr(r.Serve, func(v serveSpecRow) api.ServeSpec {
			return api.ServeSpec{Model: v.Model, Engine: v.Engine, Port: v.Port, Ready: v.Ready, Source: v.Source}
		}),
	}
}

func constraintsToRow(c api.Constraints) constraintsRow {
	return constraintsRow{
		Vendor:               c.Vendor,
		Model:                c.Model,
		Architecture:         c.Architecture,
		MinMemoryBytes:       c.MinMemoryBytes,
		MinComputeCapability: c.MinComputeCapability,
		MinDriver:            c.MinDriver,
		MinCUDA:              c.MinCUDA,
		SameNVLinkIsland:     c.SameNVLinkIsland,
		SameNUMA:             c.SameNUMA,
		Gang:                 c.Gang,
		Nodes:                c.Nodes,
	}
}

func constraintsFromRow(r constraintsRow) api.Constraints {
	return api.Constraints{
		Vendor:               r.Vendor,
		Model:                r.Model,
		Architecture:         r.Architecture,
		MinMemoryBytes:       r.MinMemoryBytes,
		MinComputeCapability: r.MinComputeCapability,
		MinDriver:            r.MinDriver,
		MinCUDA:              r.MinCUDA,
		SameNVLinkIsland:     r.SameNVLinkIsland,
		SameNUMA:             r.SameNUMA,
		Gang:                 r.Gang,
		Nodes:                r.Nodes,
	}
}

func jobSpecToRow(s api.JobSpec) jobSpecRow {
	return jobSpecRow{Command: s.Command, Image: s.Image, Env: s.Env, WorkDir: s.WorkDir, Ports: s.Ports,
		Model: mapPtr(s.Model, func(m api.JobModel) jobModelRow { return jobModelRow{Ref: m.Ref, Digest: m.Digest} })}
}

func jobSpecFromRow(r jobSpecRow) api.JobSpec {
	return api.JobSpec{Command: r.Command, Image: r.Image, Env: r.Env, WorkDir: r.WorkDir, Ports: r.Ports,
		Model: mapPtr(r.Model, func(m jobModelRow) api.JobModel { return api.JobModel{Ref: m.Ref, Digest: m.Digest} })}
}

func allocationToRow(a api.Allocation) allocationRow {
	return allocationRow{
		Node:    a.Node,
		Devices: mapSlice(a.Devices, deviceGrantToRow),
		Sandbox: mapPtr(a.Sandbox, sandboxToRow),
		Choose:  a.Choose,
	}
}

func allocationFromRow(r allocationRow) api.Allocation {
	return api.Allocation{
		Node:    r.Node,
		Devices: mapSlice(r.Devices, deviceGrantFromRow),
		Sandbox: mapPtr(r.Sandbox, sandboxFromRow),
		Choose:  r.Choose,
	}
}

func deviceGrantToRow(g api.DeviceGrant) deviceGrantRow {
	return deviceGrantRow{
		ID:          g.ID,
		Vendor:      g.Vendor,
		Index:       g.Index,
		PCIAddress:  g.PCIAddress,
		UUID:        g.UUID,
		Model:       g.Model,
		MilliGPU:    g.MilliGPU,
		MemoryBytes: g.MemoryBytes,
		Isolation:   g.Isolation,
	}
}

func deviceGrantFromRow(r deviceGrantRow) api.DeviceGrant {
	return api.DeviceGrant{
		ID:          r.ID,
		Vendor:      r.Vendor,
		Index:       r.Index,
		PCIAddress:  r.PCIAddress,
		UUID:        r.UUID,
		Model:       r.Model,
		MilliGPU:    r.MilliGPU,
		MemoryBytes: r.MemoryBytes,
		Isolation:   r.Isolation,
	}
}

func sandboxToRow(s api.Sandbox) sandboxRow {
	return sandboxRow{
		User:           s.User,
		OwnUser:        s.OwnUser,
		PIDNamespace:   s.PIDNamespace,
		MountNamespace: s.MountNamespace,
		PrivateTmp:     s.PrivateTmp,
		CleanEnv:       s.CleanEnv,
		NoNewPrivs:     s.NoNewPrivs,
		Cgroup:         s.Cgroup,
		Devices:        s.Devices,
		Missing:        s.Missing,
	}
}

func sandboxFromRow(r sandboxRow) api.Sandbox {
	return api.Sandbox{
		User:           r.User,
		OwnUser:        r.OwnUser,
		PIDNamespace:   r.PIDNamespace,
		MountNamespace: r.MountNamespace,
		PrivateTmp:     r.PrivateTmp,
		CleanEnv:       r.CleanEnv,
		NoNewPrivs:     r.NoNewPrivs,
		Cgroup:         r.Cgroup,
		Devices:        r.Devices,
		Missing:        r.Missing,
	}
}

func jobToRow(j *api.Job) jobRow {
	return jobRow{
		ID:       j.ID,
		LeaseID:  j.LeaseID,
		Project:  j.Project,
		State:    j.State,
		Spec:     jobSpecToRow(j.Spec),
		Tasks:    mapSlice(j.Tasks, taskToRow),
		ExitCode: j.ExitCode,
		Reason:   j.Reason,
		Created:  j.Created,
		Started:  j.Started,
		Finished: j.Finished,
	}
}

func jobFromRow(r jobRow) *api.Job {
	return &api.Job{
		ID:       r.ID,
		LeaseID:  r.LeaseID,
		Project:  r.Project,
		State:    r.State,
		Spec:     jobSpecFromRow(r.Spec),
		Tasks:    mapSlice(r.Tasks, taskFromRow),
		ExitCode: r.ExitCode,
		Reason:   r.Reason,
		Created:  r.Created,
		Started:  r.Started,
		Finished: r.Finished,
	}
}

func taskToRow(t api.Task) taskRow {
	return taskRow{Node: t.Node, Rank: t.Rank, State: t.State, ExitCode: t.ExitCode, Reason: t.Reason, Open: t.OpenPorts,
		GPU: mapPtr(t.GPU, func(u api.GPUUse) gpuUseRow {
			return gpuUseRow{PeakMemoryBytes: u.PeakMemoryBytes, MeanSMPercent: u.MeanSMPercent, Samples: u.Samples, SampleSeconds: u.SampleSeconds}
		})}
}

func taskFromRow(r taskRow) api.Task {
	return api.Task{Node: r.Node, Rank: r.Rank, State: r.State, ExitCode: r.ExitCode, Reason: r.Reason, OpenPorts: r.Open,
		GPU: mapPtr(r.GPU, func(u gpuUseRow) api.GPUUse {
			return api.GPUUse{PeakMemoryBytes: u.PeakMemoryBytes, MeanSMPercent: u.MeanSMPercent, Samples: u.Samples, SampleSeconds: u.SampleSeconds}
		})}
}

func nodeToRow(n NodeRecord) nodeRow {
	return nodeRow{
		Node:       nodeInfoToRow(n.Node),
		Snapshot:   n.Snapshot,
		CertSHA256: n.CertSHA256,
		KeySHA256:  n.KeySHA256,
		Replacing:  n.Replacing,
	}
}

func nodeFromRow(r nodeRow) NodeRecord {
	return NodeRecord{
		Node:       nodeInfoFromRow(r.Node),
		Snapshot:   r.Snapshot,
		CertSHA256: r.CertSHA256,
		KeySHA256:  r.KeySHA256,
		Replacing:  r.Replacing,
	}
}

func nodeInfoToRow(n api.Node) nodeInfoRow {
	return nodeInfoRow{
		ID:           n.ID,
		State:        n.State,
		LastSeen:     n.LastSeen,
		Hostname:     n.Hostname,
		Recorded:     n.Recorded,
		Executor:     n.Executor,
		Containers:   n.Containers,
		NoContainers: n.NoContainers,
		Driver:       n.Driver,
		CUDA:         n.CUDA,
		Sandbox:      mapPtr(n.Sandbox, sandboxToRow),
		Devices:      mapSlice(n.Devices, deviceToRow),
		Findings:     mapSlice(n.Findings, findingToRow),
		Joined:       n.Joined,
		Free:         n.Free,
		Total:        n.Total,
	}
}

func nodeInfoFromRow(r nodeInfoRow) api.Node {
	return api.Node{
		ID:           r.ID,
		State:        r.State,
		LastSeen:     r.LastSeen,
		Hostname:     r.Hostname,
		Recorded:     r.Recorded,
		Executor:     r.Executor,
		Containers:   r.Containers,
		NoContainers: r.NoContainers,
		Driver:       r.Driver,
		CUDA:         r.CUDA,
		Sandbox:      mapPtr(r.Sandbox, sandboxFromRow),
		Devices:      mapSlice(r.Devices, deviceFromRow),
		Findings:     mapSlice(r.Findings, findingFromRow),
		Joined:       r.Joined,
		Free:         r.Free,
		Total:        r.Total,
	}
}

func deviceToRow(d api.Device) deviceRow {
	return deviceRow{
		ID:                d.ID,
		Vendor:            d.Vendor,
		Index:             d.Index,
		Model:             d.Model,
		Architecture:      d.Architecture,
		ComputeCapability: d.ComputeCapability,
		PCIAddress:        d.PCIAddress,
		UUID:              d.UUID,
		MemoryBytes:       d.MemoryBytes,
		NUMANode:          d.NUMANode,
		Island:            d.Island,
		MIGProfile:        d.MIGProfile,
		Parent:            d.Parent,
		MIGMode:           d.MIGMode,
		Isolation:         d.Isolation,
		Drained:           d.Drained,
		DrainReason:       d.DrainReason,
		UsedMilli:         d.UsedMilli,
		Leases:            d.Leases,
		Held:              d.Held,
	}
}

func deviceFromRow(r deviceRow) api.Device {
	return api.Device{
		ID:                r.ID,
		Vendor:            r.Vendor,
		Index:             r.Index,
		Model:             r.Model,
		Architecture:      r.Architecture,
		ComputeCapability: r.ComputeCapability,
		PCIAddress:        r.PCIAddress,
		UUID:              r.UUID,
		MemoryBytes:       r.MemoryBytes,
		NUMANode:          r.NUMANode,
		Island:            r.Island,
		MIGProfile:        r.MIGProfile,
		Parent:            r.Parent,
		MIGMode:           r.MIGMode,
		Isolation:         r.Isolation,
		Drained:           r.Drained,
		DrainReason:       r.DrainReason,
		UsedMilli:         r.UsedMilli,
		Leases:            r.Leases,
		Held:              r.Held,
	}
}

func findingToRow(f api.Finding) findingRow {
	return findingRow{ID: f.ID, Severity: f.Severity, Title: f.Title, Devices: f.Devices, Remedy: f.Remedy}
}

func findingFromRow(r findingRow) api.Finding {
	return api.Finding{ID: r.ID, Severity: r.Severity, Title: r.Title, Devices: r.Devices, Remedy: r.Remedy}
}

func limitsToRow(l api.Limits) limitsRow {
	return limitsRow{
		MaxQueued:         l.MaxQueued,
		MaxQueuedPerUser:  l.MaxQueuedPerUser,
		MaxJobsPerLease:   l.MaxJobsPerLease,
		MaxEnvBytes:       l.MaxEnvBytes,
		MaxLogBytesPerJob: l.MaxLogBytesPerJob,
		MaxLogBytes:       l.MaxLogBytes,
	}
}

func limitsFromRow(r limitsRow) api.Limits {
	return api.Limits{
		MaxQueued:         r.MaxQueued,
		MaxQueuedPerUser:  r.MaxQueuedPerUser,
		MaxJobsPerLease:   r.MaxJobsPerLease,
		MaxEnvBytes:       r.MaxEnvBytes,
		MaxLogBytesPerJob: r.MaxLogBytesPerJob,
		MaxLogBytes:       r.MaxLogBytes,
	}
}
