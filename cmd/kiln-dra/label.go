package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/source"
)

func init() { addCommand(newLabelCmd) }

func newLabelCmd() *cobra.Command {
	var src sourceFlags
	var kubeconfig string
	var apply bool
	cmd := &cobra.Command{
		Use:   "label [--from CAPTURE...] [--apply --kubeconfig FILE]",
		Short: "Node labels for clusters without DRA: GPU Feature Discovery's and AMD's keys, and kiln's own",
		Long: `kiln-dra label prints (or with --apply, sets on the Node) labels that describe
the node's GPUs for schedulers without DRA: kiln's own (kiln.dev/gpu.count,
kiln.dev/nvlink-island.max, kiln.dev/gfx-target, kiln.dev/rocm-version,
kiln.dev/cuda-driver-version, kiln.dev/doctor: healthy, warning or critical),
and NVIDIA GPU Feature Discovery's (nvidia.com/gpu.product, gpu.count,
gpu.memory, gpu.compute.major ...) or AMD node labeller's (amd.com/gpu.family,
gpu.product-name, gpu.vram ...) keys where those tools do not label the node.
kiln.dev labels kiln no longer finds are removed; another tool's are never touched.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := source.Load(ctx, append(src.from, args...), src.options())
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			node := dra.DNSSubdomain(src.node)
			if node == "" {
				node = dra.DNSSubdomain(s.Host.Hostname)
			}
			if node == "" {
				node = "unnamed-node"
			}
			r, err := dra.Build(ctx, dra.Input{Snapshot: s, NodeName: node})
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			if !apply {
				labels, _ := dra.NodeLabels(r, nil, nil)
				return writeLabels(cmd, labels)
			}
			if src.node == "" {
				return &exitError{code: 3, err: fmt.Errorf("--apply needs the node's name: give --node or NODE_NAME")}
			}
			client, err := kubeClient(kubeconfig)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return &exitError{code: 3, err: fmt.Errorf("reading node %s: %w", node, err)}
			}
			owned := strings.Split(n.Annotations[dra.VendorLabelsAnnotation], ",")
			labels, own := dra.NodeLabels(r, n.Labels, owned)
			patch := map[string]any{}
			for k, v := range labels {
				patch[k] = v
			}
			// Labels kiln wrote before and no longer finds go.
			for k := range n.Labels {
				if _, keep := labels[k]; keep {
					continue
				}
				if strings.HasPrefix(k, dra.LabelPrefix) || slices.ContainsFunc(owned, func(p string) bool { return p != "" && strings.HasPrefix(k, p) }) {
					patch[k] = nil
				}
			}
			body, err := json.Marshal(map[string]any{"metadata": map[string]any{
				"labels":      patch,
				"annotations": map[string]string{dra.VendorLabelsAnnotation: strings.Join(own, ",")},
			}})
			if err != nil {
				return err
			}
			if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "kiln-dra"}); err != nil {
				return &exitError{code: 3, err: fmt.Errorf("labelling node %s: %w", node, err)}
			}
			return writeLabels(cmd, labels)
		},
	}
	src.add(cmd)
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	cmd.Flags().BoolVar(&apply, "apply", false, "set the labels on the Node instead of printing them")
	return cmd
}

func writeLabels(cmd *cobra.Command, labels map[string]string) error {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", k, labels[k])
	}
	return nil
}
