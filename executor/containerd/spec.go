package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/executor"
)

// cfsPeriod is the CFS period kiln uses for CPU limits, in microseconds.
const cfsPeriod = 100_000

// specOpts turns a job into OCI spec edits, applied after the image's own
// configuration.
func (e *Executor) specOpts(job executor.Job, image oci.Image) ([]oci.SpecOpts, error) {
	// The image's configuration, then what no job escapes: not root, no
	// capability, no new privileges, the default seccomp profile. The only
	// host paths mounted are the CDI devices (and MPS's pipe directory), and
	// the job's model from the node's cache, read-only.
	opts := []oci.SpecOpts{oci.WithImageConfig(image), e.withoutRoot(), oci.WithCapabilities([]string{}), oci.WithNoNewPrivileges, seccomp.WithDefaultProfile()}
	if len(job.Command) > 0 {
		opts = append(opts, oci.WithProcessArgs(job.Command...))
	}
	env, err := jobEnv(job)
	if err != nil {
		return nil, err
	}
	if len(env) > 0 {
		opts = append(opts, oci.WithEnv(env))
	}
	if job.WorkDir != "" {
		opts = append(opts, oci.WithProcessCwd(job.WorkDir))
	}
	if !e.cfg.IsolateNetwork {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile, oci.WithHostResolvconf)
	}
	if job.Limits.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(job.Limits.MemoryBytes))
	}
	if job.Limits.CPUMilli < 0 {
		return nil, fmt.Errorf("job %s: negative CPU limit %d", job.ID, job.Limits.CPUMilli)
	}
	if job.Limits.CPUMilli > 0 {
		// 1000 milli-CPUs is one CPU: a quota of one period.
		opts = append(opts, oci.WithCPUCFS(int64(job.Limits.CPUMilli)*cfsPeriod/1000, cfsPeriod))
	}
	if job.ModelDir != "" {
		if !filepath.IsAbs(job.ModelDir) {
			return nil, fmt.Errorf("job %s: the model's folder %q is not absolute", job.ID, job.ModelDir)
		}
		opts = append(opts, oci.WithMounts([]specs.Mount{{
			Destination: executor.ModelTarget, Source: job.ModelDir, Type: "bind",
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
		}}))
	}
	names, err := cdiNames(job.Devices)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", job.ID, err)
	}
	if len(names) > 0 {
		opts = append(opts, e.withCDIDevices(names))
	}
	if mps := mpsShare(job.Devices); mps != nil {
		opts = append(opts, oci.WithEnv(mpsEnv(mps)))
		if st, err := os.Stat(e.cfg.MPSPipeDir); err == nil && st.IsDir() {
			opts = append(opts, oci.WithEnv([]string{"CUDA_MPS_PIPE_DIRECTORY=" + e.cfg.MPSPipeDir}), oci.WithMounts([]specs.Mount{{
				Destination: e.cfg.MPSPipeDir, Source: e.cfg.MPSPipeDir, Type: "bind",
				Options: []string{"rbind", "rw", "nosuid", "nodev"},
			}}))
		}
	}
	return opts, nil
}

// withoutRoot makes a container whose image runs it as root (or names no
// user) run as the job user instead.
func (e *Executor) withoutRoot() oci.SpecOpts {
	uid, gid := e.cfg.JobUID, e.cfg.JobGID
	if uid == 0 {
		uid, gid = 65534, 65534
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		if s.Process.User.UID == 0 {
			s.Process.User = specs.User{UID: uid, GID: gid}
		}
		if s.Process.User.GID == 0 {
			s.Process.User.GID = gid
		}
		return nil
	}
}

// jobEnv is the job's environment as sorted KEY=value pairs.
func jobEnv(job executor.Job) ([]string, error) {
	keys := make([]string, 0, len(job.Env))
	for k := range job.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("job %s: environment variable name %q is not valid", job.ID, k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		if strings.ContainsAny(job.Env[k], "\x00") {
			return nil, fmt.Errorf("job %s: environment variable %s holds a NUL byte", job.ID, k)
		}
		env = append(env, k+"="+job.Env[k])
	}
	return env, nil
}

// cdiNames are the CDI devices of a job: the name the lease gave, or the
// kiln device of the GPU's index.
func cdiNames(devs []executor.Device) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	for _, d := range devs {
		name := d.CDIName
		if name == "" {
			if d.Index < 0 {
				return nil, fmt.Errorf("device %+v has neither a CDI name nor an index", d)
			}
			name = cdi.QualifiedName(cdi.GPUName(d.Index))
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names, nil
}

// withCDIDevices injects CDI devices into the container's spec.
func (e *Executor) withCDIDevices(names []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		return cdi.Inject(s, e.cfg.CDIDirs, names...)
	}
}

// mpsShare is the first MPS share among the devices.
func mpsShare(devs []executor.Device) *executor.Share {
	for _, d := range devs {
		if d.Share != nil && d.Share.Isolation == "mps" {
			return d.Share
		}
	}
	return nil
}

// mpsEnv is what an MPS client reads: its share of the SMs and its
// memory limit on the (first, inside the container) device.
func mpsEnv(s *executor.Share) []string {
	var env []string
	if s.MilliGPU > 0 {
		pct := (s.MilliGPU + 9) / 10
		env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(min(pct, 100)))
	}
	if s.MemoryBytes > 0 {
		mb := s.MemoryBytes >> 20
		env = append(env, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", max(mb, 1)))
	}
	return env
}
