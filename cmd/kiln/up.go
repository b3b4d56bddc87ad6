//go:build !agentonly

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/demo"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/snapshot"
)

func init() { addCommand(newUpCmd) }

// loadDemo returns the Snapshot of a recorded machine, completed from the
// knowledge base as a live machine's is.
func loadDemo(m demo.Machine) (*snapshot.Snapshot, error) {
	s, err := m.Snapshot()
	if err != nil {
		return nil, err
	}
	kb.Default().Annotate(s)
	if s.Host.Hostname == "" {
		s.Host.Hostname = m.Node
	}
	return s, nil
}

func newUpCmd() *cobra.Command {
	var f serverFlags
	var withDemo, noLocal bool
	var configPath string
	var heartbeat time.Duration
	var ctrFlags containerFlags
	var modelFlags modelCacheFlags
	cmd := &cobra.Command{
		Use:   "up [--demo]",
		Short: "Start a kiln server and an agent for this machine: GPUs as a service on one box",
		Long: `kiln up runs the lease server and this machine's agent in one process, with the
data in ~/.local/share/kiln (or --data). It writes the admin's client
configuration to ~/.config/kiln/client.json, so 'kiln run', 'kiln lease',
'kiln ls', 'kiln nodes' and the others work from this shell at once.

--demo adds agents that replay recorded machines built into kiln: an 8-GPU
H100 HGX server, an 8-GPU MI300X server and a 4-GPU L40S PCIe box. Their GPUs are
recorded, not real: jobs placed there run on this machine as ordinary processes,
with the GPU environment (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, MPS limits)
set as it would be on the real machine. Try the whole service on a laptop, or on
any machine without GPUs.

Ctrl-C stops everything; the next kiln up finds its leases, projects and tokens
again.`,
		Example: `  scripts/install.sh && ./kiln up
  ./kiln up --demo
  ./kiln up --demo --data /tmp/kiln-demo --listen 127.0.0.1:7450`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			out := cmd.OutOrStdout()
			// Refuse a job setup that cannot run before anything is written
			// to the data directory.
			if !noLocal || withDemo {
				if _, err := ctrFlags.sandbox(nil); err != nil {
					return &exitError{code: 3, err: err}
				}
			}
			log := slog.Default()
			srv, ln, url, err := f.start(ctx, log)
			if err != nil {
				return err
			}
			var wg sync.WaitGroup
			defer func() {
				cancel()
				wg.Wait()
				srv.Close()
			}()
			wg.Add(1)
			go func() { defer wg.Done(); _ = srv.Serve(ctx, ln) }()
			admin, err := adminConfig(srv, f.data, url)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			cfgNote := writeUserConfig(admin, configPath)
			client, err := admin.Client()
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			type node struct {
				name     string
				discover func(context.Context) (*snapshot.Snapshot, error)
				recorded bool
				what     string
			}
			var nodes []node
			var local string
			if !noLocal {
				var src sourceFlags
				local = hostNodeName()
				nodes = append(nodes, node{name: local, discover: func(ctx context.Context) (*snapshot.Snapshot, error) { return src.load(ctx, nil) }, what: "this machine"})
			}
			if withDemo {
				for _, m := range demo.Machines() {
					s, err := loadDemo(m)
					if err != nil {
						return &exitError{code: 3, err: err}
					}
					nodes = append(nodes, node{name: m.Node, discover: func(context.Context) (*snapshot.Snapshot, error) { return s, nil }, recorded: true, what: m.What})
				}
			}
			for _, n := range nodes {
				id, err := localIdentity(ctx, srv, url, n.name, filepath.Join(f.data, "agents", n.name))
				if err != nil {
					return &exitError{code: 3, err: err}
				}
				state := filepath.Join(f.data, "agents", n.name)
				proc, ctr, noCtr, err := ctrFlags.executors(ctx, n.name, state, []string{f.data, filepath.Dir(cfgPathOf(configPath))}, log)
				if err != nil {
					return &exitError{code: 3, err: err}
				}
				a, err := agent.New(agent.Config{Identity: id, Executor: proc, Containers: ctr, NoContainers: noCtr, CDIDir: ctrFlags.cdiDir,
					Discover: n.discover, Recorded: n.recorded, Heartbeat: heartbeat, Models: modelFlags.puller(), Logger: log})
				if err != nil {
					return &exitError{code: 3, err: err}
				}
				wg.Add(1)
				go func() { defer wg.Done(); _ = a.Run(ctx) }()
			}
			ready := waitReady(ctx, client, len(nodes), 20*time.Second)
			printUp(out, url, f.data, cfgNote, ready, withDemo, local)
			<-ctx.Done()
			fmt.Fprintln(cmd.ErrOrStderr(), "kiln up: stopping")
			return nil
		},
	}
	f.add(cmd, "127.0.0.1:7443")
	cmd.Flags().BoolVar(&withDemo, "demo", false, "also run agents that replay recorded machines built into kiln (their GPUs are not real)")
	cmd.Flags().BoolVar(&noLocal, "no-local-agent", false, "do not run an agent for this machine")
	cmd.Flags().StringVar(&configPath, "config", "", "where to write the client configuration (default $KILN_CONFIG or ~/.config/kiln/client.json)")
	cmd.Flags().DurationVar(&heartbeat, "heartbeat", 2*time.Second, "agents' heartbeat interval")
	ctrFlags.add(cmd)
	modelFlags.add(cmd)
	return cmd
}

// localIdentity reuses an agent identity kept in dir, or joins with a
// fresh join token.
func localIdentity(ctx context.Context, srv *server.Server, url, node, dir string) (*agent.Identity, error) {
	if id, err := agent.LoadIdentity(dir); err == nil {
		id.Server = url
		return id, nil
	}
	jt, err := srv.CreateJoinToken(ctx, 10*time.Minute, 1, "kiln up")
	if err != nil {
		return nil, err
	}
	return agent.Join(ctx, url, jt.Secret, srv.CAFingerprint(), node, dir)
}

func cfgPathOf(path string) string {
	if path == "" {
		return api.DefaultConfigPath()
	}
	return path
}

// writeUserConfig saves the admin configuration where the CLI looks,
// unless a configuration for another server is there.
func writeUserConfig(cfg *api.ClientConfig, path string) string {
	if path == "" {
		path = api.DefaultConfigPath()
	}
	if old, err := api.LoadClientConfig(path); err == nil && old.Server != cfg.Server && old.CAPEM != cfg.CAPEM {
		return fmt.Sprintf("%s is for another server (%s); use this one with KILN_CONFIG=%s", path, old.Server, filepath.Join(filepath.Dir(path), "..", "..", ".local", "share", "kiln", "admin-client.json"))
	}
	if err := cfg.Save(path); err != nil {
		return fmt.Sprintf("could not write %s: %v", path, err)
	}
	return "client configuration (admin): " + path
}

func waitReady(ctx context.Context, c *api.Client, want int, within time.Duration) []api.Node {
	deadline := time.Now().Add(within)
	var nodes []api.Node
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if nl, err := c.Nodes(ctx); err == nil {
			nodes = nl
			n := 0
			for _, nd := range nl {
				if nd.State == api.NodeReady {
					n++
				}
			}
			if n >= want {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nodes
}

// printUp says where kiln is, which nodes are ready and what to try:
// jobs where a ready node has GPUs, else the demo. local is this machine's
// node ("" without one).
func printUp(w io.Writer, url, data, cfgNote string, nodes []api.Node, demo bool, local string) {
	fmt.Fprintf(w, "kiln is up at %s (data in %s)\n%s\n\n", url, data, cfgNote)
	writeNodeTable(w, nodes)
	if demo {
		fmt.Fprintln(w, "\nThe demo nodes replay RECORDED machines: their GPUs are not real. Jobs placed on them")
		fmt.Fprintln(w, "run here as plain processes, with the GPU environment set as on the real machine.")
	}
	if !demo && !anyGPUReady(nodes) {
		if n, ok := findNode(nodes, local); ok && n.State == api.NodeReady {
			fmt.Fprintln(w, "\nNo GPU found on this machine: a job that asks for GPUs would be refused.")
		} else {
			fmt.Fprintln(w, "\nNo node with a GPU is ready: a job that asks for GPUs would be refused.")
		}
		fmt.Fprintln(w, "To try the service without GPUs, stop kiln (Ctrl-C) and start it again with the")
		fmt.Fprintln(w, "recorded machines built into kiln (their GPUs are not real):")
		fmt.Fprintln(w, "  ./kiln up --demo")
		fmt.Fprintln(w, "Ctrl-C stops the server and its agents.")
		return
	}
	fmt.Fprintln(w, "\nTry:")
	fmt.Fprintln(w, "  ./kiln nodes")
	fmt.Fprintln(w, `  ./kiln run --gpus 2 --same-nvlink -- sh -c 'echo GPUs: $CUDA_VISIBLE_DEVICES$ROCR_VISIBLE_DEVICES'`)
	fmt.Fprintln(w, `  ./kiln run --fraction 0.25 --mem 10G -- sh -c 'env | grep -E "KILN_ISOLATION|CUDA_MPS"'`)
	fmt.Fprintln(w, "  ./kiln ls --all")
	fmt.Fprintln(w, "  ./kiln ui        # a one-time link to the web page: fleet, topology, queue")
	fmt.Fprintln(w, "Ctrl-C stops the server and its agents.")
}

// anyGPUReady says whether a ready node has a GPU.
func anyGPUReady(nodes []api.Node) bool {
	for _, n := range nodes {
		if n.State == api.NodeReady && (n.Total > 0 || len(n.Devices) > 0) {
			return true
		}
	}
	return false
}

func findNode(nodes []api.Node, id string) (api.Node, bool) {
	for _, n := range nodes {
		if id != "" && n.ID == id {
			return n, true
		}
	}
	return api.Node{}, false
}
