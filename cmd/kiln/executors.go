package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
)

// containerFlags choose how an agent runs jobs: the sandbox of jobs run as
// processes, and the container executor for jobs that name an image.
type containerFlags struct {
	address     string
	none        bool
	plainHTTP   []string
	cdiDir      string
	snapshotter string
	isolateNet  bool

	jobUser   string
	jobUIDs   string
	jobDir    string
	jobGroups []string
	pidsMax   int
	noNS      bool
}

func (f *containerFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.address, "containerd", "/run/containerd/containerd.sock", "containerd's socket, for jobs that name an image")
	fl.BoolVar(&f.none, "no-containers", false, "run no job that names an image on this node (the server places them elsewhere)")
	fl.StringSliceVar(&f.plainHTTP, "plain-http", nil, "registries (host:port) reached over plain HTTP, a lab's local registry; * for all")
	fl.StringVar(&f.cdiDir, "cdi-dir", "", "where the agent writes the CDI spec of this node's GPUs (default /var/run/cdi)")
	fl.BoolVar(&f.isolateNet, "container-network-isolated", false, "give each image job a network namespace of its own with only loopback (default: the node's, as multi-node jobs need); its ports are still reached through kiln forward")
	fl.StringVar(&f.snapshotter, "snapshotter", "", "containerd snapshotter for job images (default containerd's, overlayfs; native where overlayfs cannot mount)")
	fl.StringVar(&f.jobUser, "job-user", "", "who jobs run as: per-lease (default for root: a uid of its own per lease), per-user (one per kiln user), or a user name for every job (a single-user machine; needed when kiln does not run as root)")
	fl.StringVar(&f.jobUIDs, "job-uids", "700000-799999", "the uids given to leases or kiln users")
	fl.StringVar(&f.jobDir, "job-dir", "/var/lib/kiln-jobs", "where each job gets its private directory, under NODE/ (it and its parents must be enterable by job users)")
	fl.StringSliceVar(&f.jobGroups, "job-groups", nil, "supplementary groups of every job (default: render and video where they exist, for AMD and Intel GPUs)")
	fl.IntVar(&f.pidsMax, "job-pids-max", 4096, "processes a job may have (cgroup v2)")
	fl.BoolVar(&f.noNS, "no-job-namespaces", false, "run jobs without PID and mount namespaces of their own (the lease says so)")
}

// sandbox is the process executor's sandbox from the flags; hide are the
// paths of kiln's state jobs must not see.
func (f *containerFlags) sandbox(hide []string) (*process.Sandbox, error) {
	sb := &process.Sandbox{WorkRoot: f.jobDir, Hide: hide, PidsMax: f.pidsMax, NoNamespaces: f.noNS, Groups: f.jobGroups}
	if f.jobGroups == nil {
		for _, g := range []string{"render", "video"} {
			if _, err := user.LookupGroup(g); err == nil {
				sb.Groups = append(sb.Groups, g)
			}
		}
	}
	first, last, ok := strings.Cut(f.jobUIDs, "-")
	a, err1 := strconv.ParseUint(first, 10, 32)
	b, err2 := strconv.ParseUint(last, 10, 32)
	if !ok || err1 != nil || err2 != nil || a == 0 || b < a {
		return nil, fmt.Errorf("--job-uids %s: want FIRST-LAST, above 0", f.jobUIDs)
	}
	sb.FirstUID, sb.LastUID = uint32(a), uint32(b)
	switch f.jobUser {
	case "":
		if os.Geteuid() != 0 {
			me, _ := user.Current()
			name := "$(id -un)"
			if me != nil {
				name = me.Username
			}
			return nil, fmt.Errorf("kiln does not run as root, so it cannot give jobs users of their own, and it never runs them as its own user unasked: they could read its keys and data and other jobs' output. Run kiln as root, or on a single-user machine pass --job-user %s", name)
		}
		sb.Users = process.UsersPerLease
	case process.UsersPerLease, process.UsersPerKilnUser:
		sb.Users = f.jobUser
	default:
		sb.Users, sb.User = process.UsersFixed, f.jobUser
	}
	return sb, nil
}

// executors makes a node's executors: processes, with their records in
// state (a restarted agent stops what its previous run left), and the
// container executor where it can run; otherwise the reason it cannot.
func (f *containerFlags) executors(ctx context.Context, node, state string, hide []string, log *slog.Logger) (proc executor.Executor, ctr executor.Executor, noCtr string, err error) {
	sb, err := f.sandbox(append([]string{state}, hide...))
	if err != nil {
		return nil, nil, "", err
	}
	sb.WorkRoot = filepath.Join(sb.WorkRoot, node) // agents of one host keep apart
	pe := &process.Executor{StateDir: filepath.Join(state, "jobs"), Sandbox: sb}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, nil, "", err
	}
	proc = pe
	if f.none {
		return proc, nil, "the agent was started with --no-containers", nil
	}
	ctr, noCtr = f.containerExecutor(ctx, node, state, log)
	return proc, ctr, noCtr, nil
}
