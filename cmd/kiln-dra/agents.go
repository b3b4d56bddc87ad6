package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/executor/kube"
)

func init() { addCommand(newAgentsCmd) }

// agentsFlags are kiln-dra agents' settings.
type agentsFlags struct {
	kubeconfig, url, token, tokenFile, caSHA, state, nodes, prefix string
	heartbeat, watch, unschedulable                                time.Duration
}

func newAgentsCmd() *cobra.Command {
	var f agentsFlags
	cmd := &cobra.Command{
		Use:   "agents --url SERVER --token JOIN --ca-sha256 FP --state DIR [--nodes n1,n2] [--watch 30s]",
		Short: "Run kiln's agent for every GPU node of the cluster, its jobs as Pods",
		Long: `kiln-dra agents makes a kiln server place leases on a Kubernetes cluster: for
each node that publishes gpu.kiln.dev devices (kiln-dra plugin), it joins the
server as a kiln node (once; the identity is kept under --state/NODE) and runs
kiln's agent for it. The node's GPUs are read back from its ResourceSlices, and
its jobs run as Pods: a ResourceClaim pinned to the GPUs kiln granted, by UUID,
and a Pod using it, in the namespace kiln-PROJECT. kiln keeps its queue, fair
share, quotas, time limits and preemption; the kube-scheduler binds the Pod to
the devices kiln chose. Cancelling a lease deletes its Pod and claim.

The token must allow one use per node that has not joined yet
(kiln token join --uses N). --token-file reads it from a file each time a node
joins, so that whoever writes the file may replace it; 'kiln server --backend
kubernetes' runs this command so, with a token it renews.

With --watch, the nodes are listed again at that interval and nodes that
appear join and run too; a node that stops publishing keeps its agent, and
its GPUs are read as gone.`,
		Example: `  kiln token join --uses 64          # on a kiln admin's machine
  kiln-dra agents --url https://kiln.lab:7443 --token kiln_join_... \
      --ca-sha256 3f2a... --state /var/lib/kiln-agents --watch 30s`,
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd.Context()) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fl.StringVar(&f.url, "url", "", "the kiln server, for nodes that have not joined")
	fl.StringVar(&f.token, "token", "", "a join token with a use per node that has not joined (or $KILN_JOIN_TOKEN)")
	fl.StringVar(&f.tokenFile, "token-file", "", "read the join token from this file when a node joins")
	fl.StringVar(&f.caSHA, "ca-sha256", "", "the server CA's fingerprint, from its join command")
	fl.StringVar(&f.state, "state", "", "folder of the nodes' kiln identities")
	fl.StringVar(&f.nodes, "nodes", "", "only these nodes, separated by commas (default every node with kiln devices)")
	fl.StringVar(&f.prefix, "namespace-prefix", "kiln-", "namespaces of projects: PREFIX + project")
	fl.DurationVar(&f.heartbeat, "heartbeat", 5*time.Second, "heartbeat interval")
	fl.DurationVar(&f.unschedulable, "unschedulable", 2*time.Minute, "end a job whose Pod the scheduler cannot place for this long, with the scheduler's reason, so its lease does not hold GPUs for a Pod that never runs")
	fl.DurationVar(&f.watch, "watch", 0, "list the GPU nodes again at this interval and run agents for new ones (0: list once)")
	return cmd
}

func (f *agentsFlags) run(ctx context.Context) error {
	if f.state == "" {
		return &exitError{code: 3, err: errors.New("give --state DIR: the nodes' kiln identities are kept there")}
	}
	if f.watch < 0 {
		return &exitError{code: 3, err: fmt.Errorf("--watch %s: want a positive interval, or 0 to list the nodes once", f.watch)}
	}
	if f.token == "" {
		f.token = os.Getenv("KILN_JOIN_TOKEN")
	}
	restConfig, err := kubeConfig(f.kubeconfig)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]bool{}
	for {
		nodes, err := f.list(ctx, client)
		switch {
		case err != nil && f.watch == 0:
			return &exitError{code: 3, err: err}
		case err != nil:
			slog.Warn("listing the cluster's GPU nodes", "err", err, "again in", f.watch)
		case len(nodes) == 0 && f.watch == 0:
			return &exitError{code: 3, err: errors.New("no node of the cluster publishes gpu.kiln.dev devices: install kiln-dra plugin first (deploy/)")}
		}
		started := 0
		for _, node := range nodes {
			if running[node] {
				continue
			}
			ag, err := f.agent(ctx, client, restConfig, node)
			if err != nil {
				if f.watch == 0 {
					return err
				}
				slog.Warn("node not running", "node", node, "err", err, "again in", f.watch)
				continue
			}
			running[node] = true
			started++
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ag.Run(ctx); err != nil && ctx.Err() == nil {
					slog.Error("agent stopped", "node", node, "err", err)
				}
			}()
		}
		if started > 0 {
			slog.Info("kiln agents running", "started", started, "nodes", len(running))
		}
		if f.watch == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.watch):
		}
	}
}

// list is the cluster's GPU nodes, kept to --nodes.
func (f *agentsFlags) list(ctx context.Context, client kubernetes.Interface) ([]string, error) {
	nodes, err := kube.GPUNodes(ctx, client)
	if err != nil {
		return nil, err
	}
	if f.nodes != "" {
		want := strings.Split(f.nodes, ",")
		nodes = slices.DeleteFunc(nodes, func(n string) bool { return !slices.Contains(want, n) })
	}
	return nodes, nil
}

// agent loads or makes node's kiln identity and returns its agent.
func (f *agentsFlags) agent(ctx context.Context, client kubernetes.Interface, restConfig *rest.Config, node string) (*agent.Agent, error) {
	dir := filepath.Join(f.state, node)
	id, err := agent.LoadIdentity(dir)
	if err != nil {
		token, terr := f.joinToken()
		if terr != nil || f.url == "" || f.caSHA == "" {
			return nil, &exitError{code: 3, err: fmt.Errorf("node %s has not joined: give --url, --token (or --token-file) and --ca-sha256 (%w)", node, errors.Join(err, terr))}
		}
		if id, err = agent.Join(ctx, f.url, token, f.caSHA, node, dir); err != nil {
			return nil, &exitError{code: 1, err: fmt.Errorf("joining node %s: %w", node, err)}
		}
	}
	ke := &kube.Executor{Client: client, Config: restConfig, Node: node, NamespacePrefix: f.prefix, Unschedulable: f.unschedulable, Log: slog.Default()}
	ag, err := agent.New(agent.Config{Identity: id, Executor: ke, Containers: ke, Heartbeat: f.heartbeat,
		CDIDir: filepath.Join(dir, "cdi"), WorkDir: os.TempDir(), Discover: kube.Discover(client, node)})
	if err != nil {
		return nil, &exitError{code: 3, err: err}
	}
	return ag, nil
}

// joinToken is --token, or the token in --token-file as it is now.
func (f *agentsFlags) joinToken() (string, error) {
	if f.tokenFile == "" {
		if f.token == "" {
			return "", errors.New("no join token")
		}
		return f.token, nil
	}
	b, err := os.ReadFile(f.tokenFile)
	if err != nil {
		return "", fmt.Errorf("reading the join token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || len(t) > 512 || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("%s holds no join token", f.tokenFile)
	}
	return t, nil
}
