package main

import (
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

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/executor/kube"
)

func init() { addCommand(newAgentsCmd) }

func newAgentsCmd() *cobra.Command {
	var kubeconfig, url, token, caSHA, state, nodeList, prefix string
	var heartbeat time.Duration
	cmd := &cobra.Command{
		Use:   "agents --url SERVER --token JOIN --ca-sha256 FP --state DIR [--nodes n1,n2]",
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
(kiln token join --uses N).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if state == "" {
				return &exitError{code: 3, err: errors.New("give --state DIR: the nodes' kiln identities are kept there")}
			}
			client, err := kubeClient(kubeconfig)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			ctx := cmd.Context()
			nodes, err := kube.GPUNodes(ctx, client)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			if nodeList != "" {
				want := strings.Split(nodeList, ",")
				nodes = slices.DeleteFunc(nodes, func(n string) bool { return !slices.Contains(want, n) })
			}
			if len(nodes) == 0 {
				return &exitError{code: 3, err: errors.New("no node of the cluster publishes gpu.kiln.dev devices: install kiln-dra plugin first (deploy/)")}
			}
			var wg sync.WaitGroup
			for _, node := range nodes {
				dir := filepath.Join(state, node)
				id, err := agent.LoadIdentity(dir)
				if err != nil {
					if url == "" || token == "" || caSHA == "" {
						return &exitError{code: 3, err: fmt.Errorf("node %s has not joined: give --url, --token and --ca-sha256 (%w)", node, err)}
					}
					if id, err = agent.Join(ctx, url, token, caSHA, node, dir); err != nil {
						return &exitError{code: 1, err: fmt.Errorf("joining node %s: %w", node, err)}
					}
				}
				ke := &kube.Executor{Client: client, Node: node, NamespacePrefix: prefix, Log: slog.Default()}
				ag, err := agent.New(agent.Config{Identity: id, Executor: ke, Containers: ke, Heartbeat: heartbeat,
					CDIDir: filepath.Join(dir, "cdi"), WorkDir: os.TempDir(), Discover: kube.Discover(client, node)})
				if err != nil {
					return &exitError{code: 3, err: err}
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := ag.Run(ctx); err != nil && ctx.Err() == nil {
						slog.Error("agent stopped", "node", node, "err", err)
					}
				}()
			}
			slog.Info("kiln agents running", "nodes", len(nodes))
			wg.Wait()
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fl.StringVar(&url, "url", "", "the kiln server, for nodes that have not joined")
	fl.StringVar(&token, "token", "", "a join token with a use per node that has not joined")
	fl.StringVar(&caSHA, "ca-sha256", "", "the server CA's fingerprint, from its join command")
	fl.StringVar(&state, "state", "", "folder of the nodes' kiln identities")
	fl.StringVar(&nodeList, "nodes", "", "only these nodes, separated by commas (default every node with kiln devices)")
	fl.StringVar(&prefix, "namespace-prefix", "kiln-", "namespaces of projects: PREFIX + project")
	fl.DurationVar(&heartbeat, "heartbeat", 5*time.Second, "heartbeat interval")
	return cmd
}
