// Package api holds the wire types of kiln's HTTP/JSON API (/v1) and a
// small client for it. The server, the agent and the CLI share these types;
// openapi.yaml beside them describes the same shapes.
package api

import (
	"time"

	"kiln.dev/kiln/snapshot"
)

// Roles.
const (
	RoleAdmin  = "admin"
	RoleMember = "member"
)

// Lease states. Queued, Granted and Stopping are live; the others are final.
const (
	LeaseQueued    = "queued"
	LeaseGranted   = "granted"
	LeaseStopping  = "stopping"  // preempted, expiring or cancelled with a job still running
	LeaseDone      = "done"      // released by its user or its job ended
	LeaseCancelled = "cancelled" // cancelled before it was granted
	LeaseRefused   = "refused"   // can never be granted as asked; Reason says why
	LeasePreempted = "preempted"
	LeaseExpired   = "expired"
	LeaseLost      = "lost" // its node stopped answering
)

// LeaseFinal reports whether a lease state is final.
func LeaseFinal(state string) bool {
	switch state {
	case LeaseQueued, LeaseGranted, LeaseStopping:
		return false
	}
	return true
}

// Isolation of a fractional lease, strongest first.
const (
	IsolationMIG         = "mig"          // hardware partition
	IsolationMPS         = "mps"          // thread percentage and enforced memory limit
	IsolationTimeSlicing = "time-slicing" // none: the GPU is shared in time
	IsolationExclusive   = "exclusive"    // a whole GPU
)

// Job states.
const (
	JobPending  = "pending" // waiting for its lease
	JobAssigned = "assigned"
	JobRunning  = "running"
	JobExited   = "exited"
	JobFailed   = "failed" // could not start
	JobLost     = "lost"
	JobStopped  = "stopped" // never started: its lease ended first
)

// JobFinal reports whether a job state is final.
func JobFinal(state string) bool {
	switch state {
	case JobPending, JobAssigned, JobRunning:
		return false
	}
	return true
}

// Node states.
const (
	NodeReady = "ready"
	NodeLost  = "lost"
)

// LeaseRequest asks for GPUs. Exactly one of GPUs, Fraction and MIG is set.
type LeaseRequest struct {
	Project string `json:"project"`
	Name    string `json:"name,omitempty"`
	// GPUs is a number of whole GPUs.
	GPUs int `json:"gpus,omitempty"`
	// Fraction is the compute share of one GPU, 0 < Fraction < 1.
	Fraction float64 `json:"fraction,omitempty"`
	// MemoryBytes is the GPU memory a fractional lease needs.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// MIG is a MIG profile ("1g.10gb") or a MIG device UUID.
	MIG         string      `json:"mig,omitempty"`
	Constraints Constraints `json:"constraints,omitzero"`
	// TimeLimitSeconds ends the lease; 0 takes the server's default.
	TimeLimitSeconds int  `json:"time_limit_s,omitempty"`
	Priority         int  `json:"priority,omitempty"`
	Preemptible      bool `json:"preemptible,omitempty"`
	// Job, when set, runs as soon as the lease is granted; the lease ends
	// when the job ends.
	Job *JobSpec `json:"job,omitempty"`
	// Require lists what the lease's jobs must get from the node's
	// sandbox (SandboxOwnUser, ...): the lease goes only to nodes that give
	// it, and is refused when none could; never run with less.
	Require []string `json:"require,omitempty"`
	// Resources are host limits for each job (cgroup v2 where the node has
	// it; the node's sandbox says whether).
	Resources Resources `json:"resources,omitzero"`
	// Serve marks the lease as a model deployment (kiln serve): its job is
	// the engine, reached through the server's OpenAI-compatible endpoint.
	Serve *ServeSpec `json:"serve,omitempty"`
	// Placement says who picks the devices: kiln (PlacementKiln, the
	// default) or, on nodes of the Kubernetes backend, the cluster's
	// scheduler among the devices kiln offers (PlacementScheduler).
	Placement string `json:"placement,omitempty"`
}

// Who picks a lease's devices.
const (
	// PlacementKiln: kiln's placement picks them and the job is pinned to
	// them (the default).
	PlacementKiln = "kiln"
	// PlacementScheduler: kiln picks the node and when the lease runs (its
	// queue, fair share, limits) and offers every free device there that
	// meets the lease's constraints; the kube-scheduler picks among them
	// when the job's Pod is scheduled, and kiln then gives back the rest.
	// Only for whole GPUs on one node, with the lease's job.
	PlacementScheduler = "scheduler"
)

// Resources are a job's host limits; 0: none asked.
type Resources struct {
	CPUMilli    int    `json:"cpu_milli,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
}

// What a node's sandbox can give a job, by the names leases require them.
const (
	SandboxOwnUser        = "own-user"        // a uid of its own: not root, not the agent's
	SandboxPIDNamespace   = "pid-namespace"   // sees only its own processes
	SandboxMountNamespace = "mount-namespace" // kiln's files hidden, /tmp and /dev/shm private
	SandboxCgroup         = "cgroup"          // CPU, memory and pids limits enforced
	SandboxDevices        = "devices"         // only the lease's GPU device nodes reachable
)

// Sandbox is what a node's process executor gives every job, and what it
// cannot give and why. Nodes report it; leases state it per allocation;
// jobs find it in KILN_SANDBOX.
type Sandbox struct {
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

// Has reports whether the sandbox gives what is named (SandboxOwnUser, ...);
// a nil sandbox gives nothing.
func (s *Sandbox) Has(what string) bool {
	if s == nil {
		return false
	}
	switch what {
	case SandboxOwnUser:
		return s.OwnUser
	case SandboxPIDNamespace:
		return s.PIDNamespace
	case SandboxMountNamespace:
		return s.MountNamespace
	case SandboxCgroup:
		return s.Cgroup
	case SandboxDevices:
		return s.Devices
	}
	return false
}

// Constraints narrow where a lease may be placed.
type Constraints struct {
	Vendor       string `json:"vendor,omitempty"`
	Model        string `json:"model,omitempty"`        // the model, or whole words of its name, case-insensitive ("A100" is not an A10)
	Architecture string `json:"architecture,omitempty"` // hopper, ada, cdna3
	// MinMemoryBytes is the least memory each GPU must have.
	MinMemoryBytes       uint64 `json:"min_memory_bytes,omitempty"`
	MinComputeCapability string `json:"min_compute_capability,omitempty"` // "8.0"
	MinDriver            string `json:"min_driver,omitempty"`             // "535.104"
	MinCUDA              string `json:"min_cuda,omitempty"`               // "12.2": the driver must support it
	SameNVLinkIsland     bool   `json:"same_nvlink_island,omitempty"`
	SameNUMA             bool   `json:"same_numa,omitempty"`
	// Gang lets the GPUs come from several nodes, all granted at once.
	Gang  bool     `json:"gang,omitempty"`
	Nodes []string `json:"nodes,omitempty"`
}

// JobSpec is a command or an image to run inside a lease.
type JobSpec struct {
	Command []string          `json:"command,omitempty"`
	Image   string            `json:"image,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	WorkDir string            `json:"workdir,omitempty"`
	// Ports are TCP ports the job listens on, reached with kiln forward
	// or the server's HTTP path; no other port of the node is.
	Ports []int `json:"ports,omitempty"`
	// Model is a model of the lab's registry (kiln model push) the node
	// pulls into its cache before the job starts; {model} and
	// {model_file} in the command and the environment become its folder
	// and its weights file there.
	Model *JobModel `json:"model,omitempty"`
}

// JobModel is a model a job needs, pinned to its digest.
type JobModel struct {
	// Ref is REGISTRY/REPOSITORY@sha256:..., or with a tag and Digest.
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// DeviceGrant is one GPU, MIG instance or share of a GPU in a lease.
type DeviceGrant struct {
	// ID is the unit's id on its node: "gpu3", "gpu0/mig-1.0".
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

// Allocation is the part of a lease on one node.
type Allocation struct {
	Node    string        `json:"node"`
	Devices []DeviceGrant `json:"devices"`
	// Sandbox is what the node's jobs get (as the node said when the
	// lease was granted).
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// Choose is set while the cluster's scheduler is still to pick this
	// many of Devices (PlacementScheduler); kiln holds all of them until
	// the node reports the pick, then only those.
	Choose int `json:"choose,omitempty"`
}

// Lease is GPUs granted (or asked for) for a time.
type Lease struct {
	ID      string       `json:"id"`
	Project string       `json:"project"`
	User    string       `json:"user"`
	State   string       `json:"state"`
	Reason  string       `json:"reason,omitempty"`
	Request LeaseRequest `json:"request"`
	// Allocations are set once granted.
	Allocations []Allocation `json:"allocations,omitempty"`
	// Isolation is the weakest isolation among the lease's devices.
	Isolation string `json:"isolation,omitempty"`
	// QueuePosition is 1 for the next lease to be granted; 0 when not queued.
	QueuePosition  int        `json:"queue_position,omitempty"`
	EstimatedStart *time.Time `json:"estimated_start,omitempty"`
	// Ports are the ports the lease's live jobs declared, each waiting
	// until the agent finds it accepts connections, then open.
	Ports     []PortState `json:"ports,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
	GrantedAt *time.Time  `json:"granted_at,omitempty"`
	EndsAt    *time.Time  `json:"ends_at,omitempty"`
	EndedAt   *time.Time  `json:"ended_at,omitempty"`
	// StopDeadline is when a stopping lease's jobs are killed.
	StopDeadline *time.Time `json:"stop_deadline,omitempty"`
	Jobs         []string   `json:"jobs,omitempty"`
	// GPUs is the number of GPU equivalents the lease holds or asks for.
	GPUs float64 `json:"gpus_equivalent"`
	// Holding is true while a lost lease still holds its devices: they
	// are not granted again until its node re-registers or an admin
	// clears them.
	Holding bool `json:"holding,omitempty"`
	// Deployment is a serving lease's state and usage (Request.Serve).
	Deployment *Deployment `json:"deployment,omitempty"`
}

// Job is one command or image run inside a lease.
type Job struct {
	ID       string     `json:"id"`
	LeaseID  string     `json:"lease_id"`
	Project  string     `json:"project"`
	State    string     `json:"state"`
	Spec     JobSpec    `json:"spec"`
	Tasks    []Task     `json:"tasks,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	Created  time.Time  `json:"created_at"`
	Started  *time.Time `json:"started_at,omitempty"`
	Finished *time.Time `json:"finished_at,omitempty"`
}

// Task is a job's part on one node (a gang job has one per node).
type Task struct {
	Node     string `json:"node"`
	Rank     int    `json:"rank"`
	State    string `json:"state"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// OpenPorts are the declared ports the agent found accepting
	// connections.
	OpenPorts []int `json:"open_ports,omitempty"`
	// GPU is what the task used of its GPUs, as its agent reported at its
	// end.
	GPU *GPUUse `json:"gpu,omitempty"`
}

// States of a declared port.
const (
	PortWaiting = "waiting"
	PortOpen    = "open"
)

// PortState is a port a job declared and whether it accepts connections.
type PortState struct {
	Job   string `json:"job"`
	Port  int    `json:"port"`
	State string `json:"state"`
}

// Device is one allocatable unit on a node.
type Device struct {
	ID                string `json:"id"`
	Vendor            string `json:"vendor"`
	Index             int    `json:"index"`
	Model             string `json:"model,omitempty"`
	Architecture      string `json:"architecture,omitempty"`
	ComputeCapability string `json:"compute_capability,omitempty"`
	PCIAddress        string `json:"pci_address,omitempty"`
	UUID              string `json:"uuid,omitempty"`
	MemoryBytes       uint64 `json:"memory_bytes,omitempty"`
	NUMANode          *int   `json:"numa_node,omitempty"`
	// Island names the NVLink or xGMI island the GPU belongs to.
	Island string `json:"island,omitempty"`
	// MIGProfile is set on a MIG instance; its Parent is the GPU's id.
	MIGProfile string `json:"mig_profile,omitempty"`
	Parent     string `json:"parent,omitempty"`
	// MIGMode is true on a GPU whose MIG mode is on: only its instances are leased.
	MIGMode bool `json:"mig_mode,omitempty"`
	// Isolation is the strongest sharing the unit supports for fractions.
	Isolation   string   `json:"isolation"`
	Drained     bool     `json:"drained,omitempty"`
	DrainReason string   `json:"drain_reason,omitempty"`
	UsedMilli   int      `json:"used_milli"`
	Leases      []string `json:"leases,omitempty"`
	// Held is set while a lost lease still holds the device.
	Held bool `json:"held,omitempty"`
}

// Node is one machine running an agent.
type Node struct {
	ID       string    `json:"id"`
	State    string    `json:"state"`
	LastSeen time.Time `json:"last_seen"`
	Hostname string    `json:"hostname,omitempty"`
	// Recorded is true when the agent replays a recorded machine: its GPUs
	// are not real.
	Recorded bool   `json:"recorded,omitempty"`
	Executor string `json:"executor,omitempty"`
	// Containers is the executor of jobs with an image ("containerd");
	// empty when the node cannot run them, NoContainers says why.
	Containers   string `json:"containers,omitempty"`
	NoContainers string `json:"no_containers,omitempty"`
	Driver       string `json:"driver,omitempty"`
	CUDA         string `json:"cuda,omitempty"`
	// Sandbox is what the node's process executor gives every job.
	Sandbox  *Sandbox  `json:"sandbox,omitempty"`
	Devices  []Device  `json:"devices"`
	Findings []Finding `json:"findings,omitempty"`
	Joined   time.Time `json:"joined_at"`
	Free     float64   `json:"free_gpus"`
	Total    int       `json:"total_gpus"`
}

// Finding is a doctor finding the agent reports with its snapshot.
type Finding struct {
	ID       string   `json:"id"`
	Severity string   `json:"severity"`
	Title    string   `json:"title"`
	Devices  []string `json:"devices,omitempty"`
	// Remedy says what fixes it.
	Remedy string `json:"remedy,omitempty"`
}

// Error is the body of every error response.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
}

func (e *Error) Error() string { return e.Message }

// User is a person or robot with tokens.
type User struct {
	ID       string    `json:"id"`
	Name     string    `json:"name"`
	Role     string    `json:"role"`
	Projects []string  `json:"projects,omitempty"`
	Created  time.Time `json:"created_at"`
}

// Project is a group of users sharing quotas and a fair-share weight.
type Project struct {
	Name string `json:"name"`
	// Weight is the project's fair share relative to the others.
	Weight float64 `json:"weight"`
	// MaxGPUs limits the GPU equivalents held at once; 0: no limit.
	MaxGPUs float64 `json:"max_gpus,omitempty"`
	// GPUHours limits use per period; 0: no limit.
	GPUHours      float64  `json:"gpu_hours,omitempty"`
	PeriodSeconds int      `json:"period_s,omitempty"`
	Members       []string `json:"members,omitempty"`
	// Limits bound what the project's members may queue, run and write;
	// a zero field takes the server's default.
	Limits Limits `json:"limits,omitzero"`
	// Usage figures, filled by the server.
	HeldGPUs    float64 `json:"held_gpus"`
	UsedHours   float64 `json:"used_gpu_hours"`
	QueuedLease int     `json:"queued_leases"`
}

// Limits bound what a project's members may ask of the server, so that one
// member cannot fill its queue or its disk. The server answers 429 to a
// request over a limit that frees up with time (queued leases), 403 to one
// over a limit that does not.
type Limits struct {
	// MaxQueued is the number of queued leases of the project, and
	// MaxQueuedPerUser that of one member.
	MaxQueued        int `json:"max_queued,omitempty"`
	MaxQueuedPerUser int `json:"max_queued_per_user,omitempty"`
	// MaxJobsPerLease counts every job a lease ever ran.
	MaxJobsPerLease int `json:"max_jobs_per_lease,omitempty"`
	// MaxEnvBytes is the size of a job's environment (names and values).
	MaxEnvBytes int `json:"max_env_bytes,omitempty"`
	// MaxLogBytesPerJob and MaxLogBytes bound the output kept of one job
	// and of all the project's jobs; output beyond is dropped, and the log
	// says so.
	MaxLogBytesPerJob int64 `json:"max_log_bytes_per_job,omitempty"`
	MaxLogBytes       int64 `json:"max_log_bytes,omitempty"`
}

// TokenRequest creates an API token for a user (admins: any user, and the
// user is created when missing).
type TokenRequest struct {
	User     string   `json:"user,omitempty"`
	Role     string   `json:"role,omitempty"`
	Projects []string `json:"projects,omitempty"`
	Name     string   `json:"name,omitempty"`
	// TTLSeconds; 0: no expiry.
	TTLSeconds int `json:"ttl_s,omitempty"`
}

// Token is an API token; Secret is shown once, at creation.
type Token struct {
	ID      string     `json:"id"`
	User    string     `json:"user"`
	Name    string     `json:"name,omitempty"`
	Secret  string     `json:"token,omitempty"`
	Created time.Time  `json:"created_at"`
	Expires *time.Time `json:"expires_at,omitempty"`
}

// JoinTokenRequest creates a join token for agents.
type JoinTokenRequest struct {
	// TTLSeconds; 0: one hour.
	TTLSeconds int `json:"ttl_s,omitempty"`
	// Uses is how many nodes may join with it; 0: one.
	Uses int `json:"uses,omitempty"`
}

// JoinToken lets agents join; Command is the line to run on a node. The
// secret and the command are shown once, at creation.
type JoinToken struct {
	ID      string     `json:"id"`
	Secret  string     `json:"token,omitempty"`
	Created time.Time  `json:"created_at"`
	Expires time.Time  `json:"expires_at"`
	Command string     `json:"command,omitempty"`
	Uses    int        `json:"uses"`
	Used    int        `json:"used"`
	Revoked *time.Time `json:"revoked_at,omitempty"`
}

// DrainRequest drains devices of a node (all when Devices is empty).
type DrainRequest struct {
	Devices []string `json:"devices,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Undrain returns the devices to service.
	Undrain bool `json:"undrain,omitempty"`
	// ClearLost frees devices that leases of a lost node still hold.
	ClearLost bool `json:"clear_lost,omitempty"`
}

// Event is one entry of the server's event log.
type Event struct {
	Seq     int64     `json:"seq"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Subject string    `json:"subject"`
	Project string    `json:"project,omitempty"`
	Message string    `json:"message"`
}

// WhoAmI describes the caller.
type WhoAmI struct {
	User     string   `json:"user,omitempty"`
	Role     string   `json:"role,omitempty"`
	Projects []string `json:"projects,omitempty"`
	Node     string   `json:"node,omitempty"`
}

// Agent protocol.

// JoinRequest is sent by a new agent with the join token and a CSR.
type JoinRequest struct {
	Token  string `json:"token"`
	Node   string `json:"node"`
	CSRPEM string `json:"csr_pem"`
}

// JoinResponse carries the agent's certificate.
type JoinResponse struct {
	Node    string `json:"node"`
	CertPEM string `json:"cert_pem"`
	CAPEM   string `json:"ca_pem"`
}

// RegisterRequest is the agent's snapshot, sent at start and on change.
type RegisterRequest struct {
	Snapshot *snapshot.Snapshot `json:"snapshot"`
	Findings []Finding          `json:"findings,omitempty"`
	Recorded bool               `json:"recorded,omitempty"`
	Executor string             `json:"executor,omitempty"`
	// Containers is the executor of jobs with an image ("containerd"),
	// empty when the node runs none; NoContainers then says why.
	Containers   string `json:"containers,omitempty"`
	NoContainers string `json:"no_containers,omitempty"`
	// Sandbox is what the process executor gives every job.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// Running lists the jobs the agent runs now.
	Running []string `json:"running,omitempty"`
}

// Heartbeat says the agent is alive and what it runs.
type Heartbeat struct {
	Running []string `json:"running"`
	// WaitMS lets the server hold the answer until it has work, at most
	// this long.
	WaitMS int `json:"wait_ms,omitempty"`
	// Open lists, for running jobs that declared ports, those that
	// accept connections.
	Open map[string][]int `json:"open,omitempty"`
	// Chosen lists, for running jobs whose devices the cluster's scheduler
	// picked (Assignment.Choose), the IDs of the devices it picked.
	Chosen map[string][]string `json:"chosen,omitempty"`
	// Samples are the node's GPUs' last readings, for the web page's live
	// view and its hour of history.
	Samples []GPUSample `json:"samples,omitempty"`
}

// GPUSample is one GPU's readings at a heartbeat; a reading the GPU did
// not give is absent.
type GPUSample struct {
	// GPU is the GPU's index on the node.
	GPU int `json:"gpu"`
	// Utilization is in percent of the last sample period.
	Utilization     *float64 `json:"util,omitempty"`
	MemoryUsedBytes *uint64  `json:"mem_used,omitempty"`
	PowerW          *float64 `json:"power_w,omitempty"`
	TemperatureC    *float64 `json:"temp_c,omitempty"`
	// Processes is how many processes use the GPU, where the driver says.
	Processes *int `json:"procs,omitempty"`
}

// HeartbeatReply tells the agent what to start and stop.
type HeartbeatReply struct {
	Start []Assignment `json:"start,omitempty"`
	Stop  []StopOrder  `json:"stop,omitempty"`
	// Register asks the agent to send its snapshot again.
	Register bool `json:"register,omitempty"`
}

// Assignment is one task the agent must run.
type Assignment struct {
	JobID   string        `json:"job_id"`
	LeaseID string        `json:"lease_id"`
	Project string        `json:"project"`
	Spec    JobSpec       `json:"spec"`
	Devices []DeviceGrant `json:"devices"`
	Rank    int           `json:"rank"`
	Size    int           `json:"size"`
	EndsAt  *time.Time    `json:"ends_at,omitempty"`
	// User is the kiln user the lease is for; Require what its jobs must
	// get; Resources their host limits.
	User      string    `json:"user,omitempty"`
	Require   []string  `json:"require,omitempty"`
	Resources Resources `json:"resources,omitzero"`
	// Choose, when set, asks the cluster's scheduler to pick this many of
	// Devices; the agent reports the pick in its heartbeats (Chosen).
	Choose int `json:"choose,omitempty"`
}

// StopOrder asks the agent to stop a job after a grace period.
type StopOrder struct {
	JobID   string `json:"job_id"`
	GraceMS int    `json:"grace_ms"`
	Reason  string `json:"reason"`
	// Notice is written to the job's log before it is signalled.
	Notice string `json:"notice,omitempty"`
}

// BrowserLink opens the HTTP path to a job's port in a browser: the URL
// holds a one-time code, good until Expires, that the first visit trades
// for a session cookie.
type BrowserLink struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
}

// TunnelOrder asks an agent to connect to a port of one of its jobs for a
// user; the agent carries the connection on POST
// /v1/agent/nodes/{node}/tunnels/{id}, or says there why it could not.
type TunnelOrder struct {
	ID    string `json:"id"`
	JobID string `json:"job_id"`
	Port  int    `json:"port,omitempty"`
	// Session, instead of a port: run a command beside the job and carry
	// its terminal or its input and output as session frames.
	Session *SessionOrder `json:"session,omitempty"`
}

// SessionOrder is a session the server asks an agent to open.
type SessionOrder struct {
	SessionRequest
	// User is the kiln user who opened it (the lease's owner or an
	// admin), for the node's log.
	User string `json:"user"`
}

// ExitReport is how a task ended.
type ExitReport struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	Reason string `json:"reason"`
	// GPU is what the job's processes used of the node's GPUs while it
	// ran, where the agent could see them.
	GPU *GPUUse `json:"gpu,omitempty"`
}

// GPUUse is what a job used of its GPUs, from the agent's samples of the
// processes in the job's cgroup.
type GPUUse struct {
	// PeakMemoryBytes is the most GPU memory its processes held at once
	// (over all its GPUs), in the samples.
	PeakMemoryBytes uint64 `json:"peak_memory_bytes"`
	// MeanSMPercent is the mean over the samples of its processes' SM use
	// summed over its GPUs (100 is one GPU busy); absent where the driver
	// does not sample processes (MIG).
	MeanSMPercent *float64 `json:"mean_sm_percent,omitempty"`
	// Samples is how many samples saw it; SampleSeconds their interval.
	Samples       int     `json:"samples"`
	SampleSeconds float64 `json:"sample_s"`
}

// LeaseList is the answer of GET /v1/leases.
type LeaseList struct {
	Leases []Lease `json:"leases"`
}

// NodeList is the answer of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}
