package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/dra/plugin"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
)

func init() { addCommand(newPluginCmd) }

// kubeClient connects with a kubeconfig file, or from inside the cluster
// when none is given.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// kubeConfig is how kiln-dra reaches the apiserver: the kubeconfig file
// given, or the Pod's service account inside the cluster.
func kubeConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster (give --kubeconfig outside a pod): %w", err)
	}
	cfg.UserAgent = "kiln-dra/" + version
	return cfg, nil
}

func newPluginCmd() *cobra.Command {
	var src sourceFlags
	var kubeconfig, registrarDir, pluginDir, cdiDir, stateDir string
	var recheck time.Duration
	var shared string
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Run the kubelet plugin of gpu.kiln.dev on this node (a DaemonSet)",
		Long: `kiln-dra plugin registers the DRA driver gpu.kiln.dev with the node's kubelet,
publishes the node's GPUs as ResourceSlices (and again only when they change:
the node is read and kiln doctor run again every --recheck), prepares the
devices allocated to a pod's claims as CDI devices in a spec per claim, and
reports the devices' health to the kubelet.

--shared publishes GPUs as fractions (class fraction.gpu.kiln.dev): one
device that several claims hold at once, each asking for part of its memory
("capacity: requests: memory: 10Gi"). It needs the cluster's
DRAConsumableCapacity feature (on by default since Kubernetes 1.36); the
plugin checks, and where it is off publishes those GPUs whole and says so.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if src.node == "" {
				return &exitError{code: 3, err: fmt.Errorf("give the node's name with --node or NODE_NAME (the DaemonSet sets it from spec.nodeName)")}
			}
			client, err := kubeClient(kubeconfig)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			paths := append(src.from, args...)
			load := func(ctx context.Context) (*snapshot.Snapshot, error) {
				return source.Load(ctx, paths, src.options())
			}
			opts := cdi.Options{AssumeNodes: len(paths) > 0}
			driverRoot := ""
			if len(paths) == 0 {
				opts.Root = os.DirFS(src.root)
				driverRoot = src.root
			}
			drv, err := plugin.Start(cmd.Context(), plugin.Config{
				NodeName: src.node, KubeClient: client, Load: load,
				RegistrarDir: registrarDir, PluginDir: pluginDir, StateDir: stateDir, CDIDir: cdiDir,
				CDI: opts, DriverRoot: driverRoot, Recheck: recheck, Shared: shared,
			})
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			slog.Info("kiln-dra plugin running", "node", src.node, "dra", drv.DRASocket(), "registration", drv.RegistrationSocket())
			<-cmd.Context().Done()
			drv.Stop()
			return nil
		},
	}
	src.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fl.StringVar(&registrarDir, "registrar-dir", "", "the kubelet's plugin registry (default /var/lib/kubelet/plugins_registry)")
	fl.StringVar(&pluginDir, "plugin-dir", "", "the plugin's socket folder (default /var/lib/kubelet/plugins/gpu.kiln.dev)")
	fl.StringVar(&stateDir, "state-dir", "", "where the checkpoint is kept (default the plugin folder)")
	fl.StringVar(&cdiDir, "cdi-dir", "", "where the per-claim CDI specs go (default /var/run/cdi)")
	fl.DurationVar(&recheck, "recheck", 5*time.Minute, "how often to read the node and run the doctor again")
	fl.StringVar(&shared, "shared", os.Getenv("KILN_DRA_SHARED"), "GPUs to publish as fractions that several claims share: all, or indices such as 0,2 (default $KILN_DRA_SHARED, else none)")
	return cmd
}
