// Package containerd runs kiln jobs as containers through containerd's
// client: it pulls the job's image (over plain HTTP for the registries the
// admin names, for air-gapped labs), creates a container with the job's
// command, environment, host limits and GPUs (CDI devices that package cdi
// wrote), writes the job's output to a log file through the shim, and
// stops it with a grace period.
//
// It talks to the containerd of the node (Debian bookworm's 1.6 and later),
// in its own namespace ("kiln"), so kiln's images and containers never mix
// with those of Docker or Kubernetes on the same host.
package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/executor"
)

// Defaults for Config's empty fields.
const (
	DefaultAddress   = "/run/containerd/containerd.sock"
	DefaultNamespace = "kiln"
	DefaultRuntime   = "io.containerd.runc.v2"
	DefaultMPSPipe   = "/tmp/nvidia-mps"
)

// Labels kiln puts on its containers.
const (
	LabelJob   = "kiln.dev/job"
	LabelLease = "kiln.dev/lease"
	LabelNode  = "kiln.dev/node"
)

// Config says which containerd to use and how.
type Config struct {
	// Address is containerd's socket (DefaultAddress when empty).
	Address string
	// Namespace holds kiln's images and containers (DefaultNamespace).
	Namespace string
	// Runtime is the shim (DefaultRuntime).
	Runtime string
	// Snapshotter unpacks images; empty means containerd's default
	// (overlayfs). "native" works where overlayfs cannot be mounted.
	Snapshotter string
	// PlainHTTP lists registry hosts ("registry.lab:5000") that are reached
	// over plain HTTP instead of HTTPS: a lab's local registry. "*" means
	// every registry.
	PlainHTTP []string
	// LogDir holds one output file per job, <LogDir>/<job id>.log
	// (<temp dir>/kiln-jobs when empty). Files stay after the job ends.
	LogDir string
	// CDIDirs are where CDI specs are read (cdi.DefaultDirs when nil).
	CDIDirs []string
	// IsolateNetwork gives each container its own network namespace with
	// only a loopback interface. By default jobs share the host's network,
	// as multi-node GPU jobs (NCCL, RDMA) need.
	IsolateNetwork bool
	// MPSPipeDir is the NVIDIA MPS control daemon's pipe directory, mounted
	// into jobs with an MPS share (DefaultMPSPipe).
	MPSPipeDir string
	// PollInterval is how often a log reader looks for new output
	// (100 ms when zero).
	PollInterval time.Duration
	// JobUID and JobGID are who a container runs as when its image names
	// no user, or root (default 65534, nobody): no job runs as root. An
	// image's own non-root user is kept.
	JobUID, JobGID uint32
	// Node is the kiln node the containers run for (label kiln.dev/node):
	// Reap stops only that node's, where several agents share a host.
	Node   string
	Logger *slog.Logger
}

// Executor starts jobs as containers. It is safe for concurrent use.
type Executor struct {
	cfg    Config
	client *client.Client
	log    *slog.Logger
}

var _ executor.Executor = (*Executor)(nil)

// New connects to containerd and checks that it answers.
func New(ctx context.Context, cfg Config) (*Executor, error) {
	if cfg.Address == "" {
		cfg.Address = DefaultAddress
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.LogDir == "" {
		cfg.LogDir = filepath.Join(os.TempDir(), "kiln-jobs")
	}
	if cfg.CDIDirs == nil {
		cfg.CDIDirs = cdi.DefaultDirs
	}
	if cfg.MPSPipeDir == "" {
		cfg.MPSPipeDir = DefaultMPSPipe
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	abs, err := filepath.Abs(cfg.LogDir)
	if err != nil {
		return nil, fmt.Errorf("containerd executor: log directory: %w", err)
	}
	cfg.LogDir = abs
	if err := os.MkdirAll(cfg.LogDir, 0o750); err != nil {
		return nil, fmt.Errorf("containerd executor: log directory: %w", err)
	}
	if _, err := os.Stat(cfg.Address); err != nil {
		return nil, fmt.Errorf("containerd executor: no containerd socket at %s (is containerd running?): %w", cfg.Address, err)
	}
	c, err := client.New(cfg.Address,
		client.WithDefaultNamespace(cfg.Namespace),
		client.WithDefaultRuntime(cfg.Runtime),
		client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd executor: connecting to %s: %w", cfg.Address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := c.Version(vctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd executor: containerd at %s does not answer: %w", cfg.Address, err)
	}
	cfg.Logger.Debug("containerd executor ready", "address", cfg.Address, "containerd", v.Version, "namespace", cfg.Namespace)
	return &Executor{cfg: cfg, client: c, log: cfg.Logger}, nil
}

// Name is "containerd".
func (e *Executor) Name() string { return "containerd" }

// Close disconnects from containerd; running jobs go on.
func (e *Executor) Close() error { return e.client.Close() }

// LogPath is the file a job's output is written to.
func (e *Executor) LogPath(jobID string) string {
	return filepath.Join(e.cfg.LogDir, jobID+".log")
}

func (e *Executor) ns(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, e.cfg.Namespace)
}

// ErrNoImage is returned for a job without an image.
var ErrNoImage = errors.New("a container job needs an image")

// Running lists the jobs that have a container in kiln's namespace, by
// job id, so that an agent that restarts can reconcile them with its
// leases. A job is listed until its container is removed after it ends.
func (e *Executor) Running(ctx context.Context) ([]string, error) {
	ctrs, err := e.client.Containers(e.ns(ctx), fmt.Sprintf("labels.%q", LabelJob))
	if err != nil {
		return nil, fmt.Errorf("listing kiln's containers: %w", err)
	}
	var ids []string
	for _, c := range ctrs {
		ids = append(ids, c.ID())
	}
	sort.Strings(ids)
	return ids, nil
}
