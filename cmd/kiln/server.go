//go:build !agentonly

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/server"
)

func init() { addCommand(newServerCmd) }

// clientFlags say how a command reaches the server and, for commands that
// print records, the output format (-o).
type clientFlags struct {
	config string
	server string
	token  string
	caFile string
	format string
}

// addOutput adds -o (text, json or yaml) to a command that prints records.
func (f *clientFlags) addOutput(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.format, "output", "o", "text", "output format: text, json or yaml")
}

// structured says whether -o asked for json or yaml.
func (f *clientFlags) structured() bool { return f.format != "" && f.format != "text" }

// connect checks -o and returns the client.
func (f *clientFlags) connect() (*api.Client, *api.ClientConfig, error) {
	if f.format != "" {
		if err := checkFormat("-o", f.format, "text", "json", "yaml"); err != nil {
			return nil, nil, err
		}
	}
	return f.client()
}

func (f *clientFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "client configuration file (default $KILN_CONFIG or ~/.config/kiln/client.json, written by 'kiln up')")
	fl.StringVar(&f.server, "server", "", "server URL, https://host:7443 (overrides the configuration)")
	fl.StringVar(&f.token, "token", "", "API token (overrides the configuration; or $KILN_TOKEN)")
	fl.StringVar(&f.caFile, "ca", "", "server CA certificate file (overrides the configuration)")
}

func (f *clientFlags) client() (*api.Client, *api.ClientConfig, error) {
	path := f.config
	if path == "" {
		path = api.DefaultConfigPath()
	}
	cfg, err := api.LoadClientConfig(path)
	if err != nil {
		if f.server == "" {
			return nil, nil, &exitError{code: 3, err: err}
		}
		cfg = &api.ClientConfig{}
	}
	if f.server != "" {
		cfg.Server = f.server
	}
	if t := os.Getenv("KILN_TOKEN"); t != "" {
		cfg.Token = t
	}
	if f.token != "" {
		cfg.Token = f.token
	}
	if f.caFile != "" {
		b, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, nil, &exitError{code: 3, err: err}
		}
		cfg.CAPEM = string(b)
	}
	if cfg.CAPEM == "" {
		return nil, nil, &exitError{code: 3, err: errors.New("no server CA: pass --ca FILE (the server's ca.crt) or use the configuration 'kiln up' writes")}
	}
	c, err := cfg.Client()
	if err != nil {
		return nil, nil, &exitError{code: 3, err: err}
	}
	return c, cfg, nil
}

type serverFlags struct {
	data             string
	listen           string
	url              string
	hosts            []string
	heartbeatTimeout time.Duration
	defaultLimit     time.Duration
	maxLimit         time.Duration
	grace            time.Duration
	fairWindow       time.Duration
	tunnelIdle       time.Duration
	compatCache      string
}

func (f *serverFlags) add(cmd *cobra.Command, listen string) {
	fl := cmd.Flags()
	fl.StringVar(&f.data, "data", "", "data directory: database, CA, job logs (default $KILN_DATA or ~/.local/share/kiln)")
	fl.StringVar(&f.listen, "listen", listen, "address to serve the API on")
	fl.StringVar(&f.url, "url", "", "URL agents and users reach this server at (default https://<listen address>)")
	fl.StringSliceVar(&f.hosts, "host", nil, "extra host name or address for the server certificate (repeatable)")
	fl.DurationVar(&f.heartbeatTimeout, "heartbeat-timeout", 30*time.Second, "a node silent this long is lost")
	fl.DurationVar(&f.defaultLimit, "default-time-limit", 24*time.Hour, "time limit of leases that ask for none")
	fl.DurationVar(&f.maxLimit, "max-time-limit", 7*24*time.Hour, "longest time limit a lease may ask for")
	fl.DurationVar(&f.grace, "grace", 30*time.Second, "time a preempted or expired job gets between SIGTERM and SIGKILL")
	fl.DurationVar(&f.fairWindow, "fair-share-window", time.Hour, "half-life of past usage in the fair-share order")
	fl.DurationVar(&f.tunnelIdle, "tunnel-idle", 30*time.Minute, "a connection to a job's port (kiln forward, the HTTP path) that carries nothing this long is closed")
	fl.StringVar(&f.compatCache, "compat-cache", image.DefaultCacheDir(), "kiln compat's cache (its --cache-dir): the web page's fleet findings judge every image read there against every node, without asking a registry; \"off\" leaves them out")
}

// start opens the server and its listener; the caller serves.
func (f *serverFlags) start(ctx context.Context, log *slog.Logger) (*server.Server, net.Listener, string, error) {
	if f.data == "" {
		f.data = defaultDataDir()
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, nil, "", &exitError{code: 3, err: fmt.Errorf("listening on %s: %w", f.listen, err)}
	}
	url := f.url
	if url == "" {
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host, _ = os.Hostname()
		}
		url = "https://" + net.JoinHostPort(host, port)
	}
	server.TuneGC()
	k := kb.Default()
	var checked server.ImageCatalog
	if f.compatCache != "" && f.compatCache != "off" {
		checked = newCompatCatalog(f.compatCache, k, log)
	}
	srv, err := server.New(ctx, server.Config{
		DataDir: f.data, URL: url, Hosts: f.hosts, HeartbeatTimeout: f.heartbeatTimeout,
		DefaultTimeLimit: f.defaultLimit, MaxTimeLimit: f.maxLimit, PreemptGrace: f.grace,
		FairShareWindow: f.fairWindow, TunnelIdle: f.tunnelIdle, Logger: log, KB: k, CheckedImages: checked,
	})
	if err != nil {
		ln.Close()
		return nil, nil, "", &exitError{code: 3, err: err}
	}
	return srv, ln, url, nil
}

// adminConfig is the admin's client configuration kept in the data
// directory; written on first start.
func adminConfig(srv *server.Server, data, url string) (*api.ClientConfig, error) {
	path := filepath.Join(data, "admin-client.json")
	if srv.Bootstrap != nil {
		cfg := &api.ClientConfig{Server: url, Token: srv.Bootstrap.AdminToken, CAPEM: string(srv.CAPEM()), Project: "default"}
		return cfg, cfg.Save(path)
	}
	cfg, err := api.LoadClientConfig(path)
	if err != nil {
		return nil, err
	}
	cfg.Server, cfg.CAPEM = url, string(srv.CAPEM())
	return cfg, cfg.Save(path)
}

func newServerCmd() *cobra.Command {
	var f serverFlags
	var resetAdmin bool
	var backend, kubeconfig, prefix string
	var kubeWatch, kubeUnschedulable time.Duration
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the lease server: GPUs leased over the network to users and their jobs",
		Long: `kiln server serves kiln's HTTP/JSON API (/v1, described by api/openapi.yaml)
over TLS. Nodes run 'kiln agent' (joined with 'kiln join'); users ask for GPUs with
'kiln run', 'kiln lease' and friends.

On first start the server creates, in its data directory:
  kiln.db             the store (SQLite, WAL): users, projects, tokens, nodes, leases, jobs, events
  ca.crt, ca.key      its own certificate authority; agents pin its SHA-256, so no PKI is needed
  admin-client.json   the admin's client configuration (server URL, token, CA)
and prints the admin token and the join command for nodes, once.

Leases are whole GPUs, one MIG instance or a fraction of a GPU. A fraction runs
with the strongest isolation the GPU has: MIG (hardware), MPS (thread share and a
pinned memory limit) or time-slicing (none), and the lease says which.

The queue: projects share the GPUs by weight (fair share: GPUs held now plus
usage over the fair-share window); inside a project, higher priority first, then
arrival. The first lease that does not fit holds a reservation; smaller leases
run beside it only when they end before it starts (backfill). A lease may preempt
preemptible leases of lower priority: they get SIGTERM, a notice in their log,
and SIGKILL after the grace period. Leases end at their time limit.

A node silent for the heartbeat timeout is lost: its leases are marked lost and
its GPUs stay held until the agent registers again or an admin runs
'kiln drain NODE --clear-lost'. A node's name is bound to the key that first
joined it: nobody else joins under it until an admin runs 'kiln node replace' or
'kiln node forget'.

Backends: with --backend kubernetes the server also runs leases on a
Kubernetes cluster with kiln's DRA driver (kiln-dra plugin on its nodes). It
starts 'kiln-dra agents' beside itself (kiln-dra is found beside kiln or on
PATH): every node that publishes gpu.kiln.dev devices joins as a kiln node,
and a job is a ResourceClaim pinned to the GPUs kiln granted and a Pod, in the
namespace <prefix><project>. The queue, fair share, quotas, time limits and
preemption are kiln's; the kube-scheduler binds the Pods; cancelling deletes
them. Nodes running 'kiln agent' may join as well. The cluster's node
identities and the join token the backend uses (renewed hourly) are kept in
<data>/kubernetes. See docs/kubernetes.md.

Recovery on the server's host: 'kiln server --reset-admin' (no admin can log
in), 'kiln backup' and 'kiln restore'. See docs/security.md.`,
		Example: `  kiln server --data /var/lib/kiln --listen :7443 --url https://gpu-head.lab:7443
  KILN_CONFIG=/var/lib/kiln/admin-client.json kiln nodes
  kiln server --backend kubernetes --kubeconfig ~/.kube/config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if resetAdmin {
				return f.resetAdmin(ctx, cmd.OutOrStdout())
			}
			log := slog.Default()
			var kb *kubeBackend
			switch backend {
			case backendAgents:
			case backendKubernetes:
				dra, err := findDRA()
				if err != nil {
					return &exitError{code: 3, err: fmt.Errorf("--backend kubernetes: %w", err)}
				}
				if kubeWatch <= 0 {
					return &exitError{code: 3, err: fmt.Errorf("--kube-watch %s: want a positive interval", kubeWatch)}
				}
				if kubeUnschedulable <= 0 {
					return &exitError{code: 3, err: fmt.Errorf("--kube-unschedulable %s: want a positive time", kubeUnschedulable)}
				}
				kb = &kubeBackend{dra: dra, kubeconfig: kubeconfig, prefix: prefix, watch: kubeWatch, unschedulable: kubeUnschedulable, log: log}
			default:
				return &exitError{code: 3, err: fmt.Errorf("--backend %q: want %s (nodes run kiln agent) or %s (leases run as Pods on a cluster)", backend, backendAgents, backendKubernetes)}
			}
			srv, ln, url, err := f.start(ctx, log)
			if err != nil {
				return err
			}
			defer srv.Close()
			if kb != nil {
				kb.dir, kb.url, kb.srv = filepath.Join(f.data, "kubernetes"), backendURL(ln.Addr(), url), srv
				go kb.run(ctx)
			}
			cfgPath := filepath.Join(f.data, "admin-client.json")
			if _, err := adminConfig(srv, f.data, url); err != nil {
				return &exitError{code: 3, err: err}
			}
			printServerBanner(cmd.OutOrStdout(), srv, url, cfgPath)
			if err := srv.Serve(ctx, ln); err != nil {
				return &exitError{code: 3, err: err}
			}
			return nil
		},
	}
	f.add(cmd, ":7443")
	cmd.Flags().StringVar(&backend, "backend", backendAgents, "where leases run: agents (nodes run kiln agent) or kubernetes (also as Pods on the cluster of --kubeconfig)")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "with --backend kubernetes: the cluster's kubeconfig (default: in-cluster service account)")
	cmd.Flags().StringVar(&prefix, "namespace-prefix", "kiln-", "with --backend kubernetes: a project's jobs run in the namespace PREFIX+project")
	cmd.Flags().DurationVar(&kubeUnschedulable, "kube-unschedulable", 2*time.Minute, "with --backend kubernetes: a job whose Pod the scheduler cannot place for this long ends with the scheduler's reason (its lease then holds no GPU for a Pod that never runs)")
	cmd.Flags().DurationVar(&kubeWatch, "kube-watch", 30*time.Second, "with --backend kubernetes: how often new GPU nodes of the cluster are looked for")
	cmd.Flags().BoolVar(&resetAdmin, "reset-admin", false, "recovery on the server's host, with the server stopped: make the user admin an admin again with a new token, saved in <data>/admin-client.json, and exit")
	return cmd
}

// resetAdmin is kiln server --reset-admin: the host-local recovery when no
// admin can log in any more.
func (f *serverFlags) resetAdmin(ctx context.Context, w io.Writer) error {
	if f.data == "" {
		f.data = defaultDataDir()
	}
	tok, caPEM, err := server.ResetAdmin(ctx, f.data)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	path := filepath.Join(f.data, "admin-client.json")
	cfg, err := api.LoadClientConfig(path)
	if err != nil {
		cfg = &api.ClientConfig{Project: "default"}
	}
	if f.url != "" {
		cfg.Server = f.url
	}
	if cfg.Server == "" {
		cfg.Server = "https://" + f.listen
	}
	cfg.Token, cfg.CAPEM = tok, string(caPEM)
	if err := cfg.Save(path); err != nil {
		return &exitError{code: 3, err: err}
	}
	fmt.Fprintf(w, "admin is an admin again. New admin token (shown once, also saved in %s):\n  %s\nStart the server and use it with: KILN_CONFIG=%s kiln nodes\n", path, tok, path)
	return nil
}

func printServerBanner(w io.Writer, srv *server.Server, url, cfgPath string) {
	fmt.Fprintf(w, "kiln server at %s\n", url)
	fmt.Fprintf(w, "CA SHA-256: %s\n", srv.CAFingerprint())
	if b := srv.Bootstrap; b != nil {
		fmt.Fprintf(w, "\nFirst start. Admin token (shown once, also saved in %s):\n  %s\n", cfgPath, b.AdminToken)
		fmt.Fprintf(w, "\nOn a GPU node, run (joins one node, valid until %s; more with 'kiln token join --uses N'):\n  %s\n", b.JoinExpires.Local().Format(time.DateTime), b.JoinCommand)
	} else {
		fmt.Fprintf(w, "admin configuration: %s\nmake a join command for a node with: kiln token join\n", cfgPath)
	}
	fmt.Fprintf(w, "\nUse it with: KILN_CONFIG=%s kiln nodes\n", cfgPath)
}
