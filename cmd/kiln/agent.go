package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/discover"
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
	metrics   metricsFlags
	models    modelCacheFlags
}

// metricsFlags are the agent's Prometheus endpoint's flags.
type metricsFlags struct {
	addr      string
	interval  time.Duration
	dcgm      bool
	tokenFile string
}

func (f *metricsFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "metrics-addr", "", "serve the node's Prometheus metrics at http://ADDR/metrics (\":9402\" on every interface, \"127.0.0.1:9402\" on loopback); none when empty")
	fl.DurationVar(&f.interval, "metrics-interval", 5*time.Second, "how often the node is sampled: for its metrics (a scrape reads the last sample, never the hardware), the readings its heartbeats carry and what each job used of its GPUs")
	fl.StringVar(&f.tokenFile, "metrics-token-file", "", "a file holding the bearer token a scrape of /metrics must send (Prometheus: authorization.credentials_file); without it, whoever reaches the port, jobs on this node included, reads the names of its leases, projects and users")
	fl.BoolVar(&f.dcgm, "dcgm-names", true, "also give NVIDIA GPUs' series dcgm-exporter's names, units and labels, for its Grafana dashboard and alerts")
}

// config opens the metrics listener (nil without --metrics-addr) and, on a
// live node, the sampler; closeFn ends the sampler.
func (f *metricsFlags) config(src *sourceFlags, recorded bool) (cfg agent.MetricsConfig, closeFn func(), err error) {
	closeFn = func() {}
	if f.interval < 100*time.Millisecond {
		return cfg, closeFn, fmt.Errorf("--metrics-interval %s: want 100ms or more", f.interval)
	}
	cfg = agent.MetricsConfig{Interval: f.interval, DCGM: f.dcgm}
	if f.tokenFile != "" {
		if f.addr == "" {
			return cfg, closeFn, errors.New("--metrics-token-file: without --metrics-addr there is no /metrics to guard")
		}
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return cfg, closeFn, fmt.Errorf("--metrics-token-file: %w", err)
		}
		if cfg.Token = strings.TrimSpace(string(b)); len(cfg.Token) < 16 || strings.ContainsAny(cfg.Token, " \t\r\n") {
			return cfg, closeFn, fmt.Errorf("--metrics-token-file %s: want one token of 16 characters or more, without spaces", f.tokenFile)
		}
	}
	if f.addr != "" {
		ln, err := net.Listen("tcp", f.addr)
		if err != nil {
			return cfg, closeFn, fmt.Errorf("--metrics-addr: %w", err)
		}
		cfg.Listener = ln
	}
	if recorded {
		return cfg, closeFn, nil // a recorded machine's values do not change
	}
	// A live node is sampled with or without --metrics-addr: the samples
	// feed the heartbeats' readings and what each job used of its GPUs.
	if !src.noNVML {
		if smp, err := discover.OpenNVMLSampler(src.nvmlLib); err == nil {
			cfg.Sample = func(ctx context.Context, base *snapshot.Snapshot) (*snapshot.Snapshot, error) {
				r, err := smp.Sample(ctx)
				if err != nil {
					return nil, err
				}
				return discover.Resample(base, r), nil
			}
			return cfg, func() { _ = smp.Close() }, nil
		} else if !errors.Is(err, discover.ErrNoNVML) {
			slog.Warn("NVML does not answer: the node's metrics come from full discoveries", "err", err)
		}
	}
	// No NVML (AMD GPUs, or none): each sample is a whole discovery, done
	// only for a node that serves its metrics.
	if cfg.Listener == nil {
		return cfg, closeFn, nil
	}
	cfg.Sample = func(ctx context.Context, _ *snapshot.Snapshot) (*snapshot.Snapshot, error) { return src.load(ctx, nil) }
	return cfg, closeFn, nil
}

func (f *agentFlags) add(cmd *cobra.Command) {
	f.src.add(cmd)
	f.ctr.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.state, "state", "", "the agent's state directory: key, certificate, pinned CA (default <data>/agent)")
	fl.DurationVar(&f.heartbeat, "heartbeat", 5*time.Second, "heartbeat interval; keep it a third of the server's --heartbeat-timeout or less")
	fl.DurationVar(&f.rescan, "rescan", 5*time.Minute, "how often the node is discovered again (changes are sent to the server)")
	fl.StringVar(&f.workdir, "workdir", "", "where jobs without a working directory run (default: the agent's)")
	f.metrics.add(cmd)
	f.models.add(cmd)
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
	mcfg, closeSampler, err := f.metrics.config(&f.src, recorded)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	defer closeSampler()
	a, err := agent.New(agent.Config{Identity: id, Executor: proc, Containers: ctr, NoContainers: noCtr, CDIDir: f.ctr.cdiDir,
		Discover: discover, Recorded: recorded, Metrics: mcfg,
		Heartbeat: f.heartbeat, Rescan: f.rescan, WorkDir: f.workdir, Models: f.models.puller(), Logger: slog.Default()})
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

With --metrics-addr, the agent serves the node's Prometheus metrics: per GPU
utilisation, memory, power, temperatures, clocks, throttle reasons, PCIe link and
replays, NVLink state, ECC and row remapping, Xid counts, MIG instances and AMD
partitions, the doctor's findings, and kiln_gpu_metric_supported for what a GPU
cannot give. It samples on its own interval (--metrics-interval; NVML stays loaded
between samples) and a scrape only reads the last sample. --dcgm-names (on by
default) adds dcgm-exporter's names for NVIDIA GPUs, so its Grafana dashboard
(12239) and alerts work unchanged.

With --from, the agent replays a recorded machine (a record bundle or captures)
instead of this one: its GPUs are recorded, not real, and the server shows it.`,
		Example: `  kiln agent
  kiln agent --state /var/lib/kiln/agent --heartbeat 5s
  kiln agent --state ./demo-agent --from testdata/fixtures/h100-hgx8-sysfs   # a recorded machine
  kiln agent --metrics-addr :9402                 # Prometheus scrapes http://NODE:9402/metrics`,
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
