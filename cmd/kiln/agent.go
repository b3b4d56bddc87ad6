package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

func init() { addCommand(newAgentCmd) }

type agentFlags struct {
	src       sourceFlags
	ctr       containerFlags
	state     string
	heartbeat time.Duration
	rescan    time.Duration
	workdir   string
}

func (f *agentFlags) add(cmd *cobra.Command) {
	f.src.add(cmd)
	f.ctr.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.state, "state", "", "the agent's state directory: key, certificate, pinned CA (default <data>/agent)")
	fl.DurationVar(&f.heartbeat, "heartbeat", 5*time.Second, "heartbeat interval; keep it a third of the server's --heartbeat-timeout or less")
	fl.DurationVar(&f.rescan, "rescan", 5*time.Minute, "how often the node is discovered again (changes are sent to the server)")
	fl.StringVar(&f.workdir, "workdir", "", "where jobs without a working directory run (default: the agent's)")
}

func (f *agentFlags) stateDir() string {
	if f.state != "" {
		return f.state
	}
	return filepath.Join(defaultDataDir(), "agent")
}

// run serves as the agent of an identity until ctx ends.
func (f *agentFlags) run(ctx context.Context, id *agent.Identity) error {
	recorded := len(f.src.from) > 0
	var cached *snapshot.Snapshot
	discover := func(ctx context.Context) (*snapshot.Snapshot, error) {
		if recorded && cached != nil {
			return cached, nil
		}
		s, err := f.src.load(ctx, nil)
		if err == nil && recorded {
			cached = s
		}
		return s, err
	}
	proc, ctr, noCtr, err := f.ctr.executors(ctx, id.Node, f.stateDir(), []string{defaultDataDir(), filepath.Dir(api.DefaultConfigPath())}, slog.Default())
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	if noCtr != "" {
		slog.Info("jobs that name an image do not run on this node", "reason", noCtr)
	}
	a, err := agent.New(agent.Config{Identity: id, Executor: proc, Containers: ctr, NoContainers: noCtr, CDIDir: f.ctr.cdiDir,
		Discover: discover, Recorded: recorded,
		Heartbeat: f.heartbeat, Rescan: f.rescan, WorkDir: f.workdir, Logger: slog.Default()})
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	if err := a.Run(ctx); err != nil {
		return &exitError{code: 3, err: err}
	}
	return nil
}

func newAgentCmd() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run this node's agent: report its GPUs to the server and run the jobs it assigns",
		Long: `kiln agent serves a node that joined a server ('kiln join' does both). It sends
the node's Snapshot and the doctor's findings at start and when they change,
heartbeats, runs assigned jobs as local processes with the GPU environment set
(CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES and
HIP_VISIBLE_DEVICES; MPS limits for fractions; cgroup v2 limits when it may write
them) and streams their output to the server.

Jobs that name an image (kiln run --image) run through the node's containerd
(--containerd), with the GPUs injected as CDI devices from the spec the agent
writes for this node (--cdi-dir). Where containerd does not answer, the agent
tells the server why, and the server places image jobs on other nodes or
refuses them with that reason.

The agent keeps a record of each running job under its state directory. If it
crashes, its jobs go on; when it starts again it stops them (SIGTERM, then
SIGKILL) before it tells the server what runs, so their GPUs are never granted
while an old job still uses them.

The server drains the devices named by critical doctor findings. The agent
authenticates with the certificate it got when joining, and trusts only the CA it
pinned then.

With --from, the agent replays a recorded machine (a record bundle or captures)
instead of this one: its GPUs are recorded, not real, and the server shows it.`,
		Example: `  kiln agent
  kiln agent --state /var/lib/kiln/agent --heartbeat 5s
  kiln agent --state ./demo-agent --from testdata/fixtures/h100-hgx8-sysfs   # a recorded machine`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := agent.LoadIdentity(f.stateDir())
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kiln agent: node %s, server %s\n", printable(id.Node), printable(id.Server))
			return f.run(cmd.Context(), id)
		},
	}
	f.add(cmd)
	return cmd
}

var nodeNameRE = regexp.MustCompile(`[^a-z0-9._-]+`)

// nodeName turns a host name into a node name the server accepts.
func nodeName(host string) string {
	n := strings.Trim(nodeNameRE.ReplaceAllString(strings.ToLower(host), "-"), "-._")
	if n == "" {
		n = "node"
	}
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

func hostNodeName() string {
	h, _ := os.Hostname()
	return nodeName(h)
}
