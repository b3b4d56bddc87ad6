package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/source"
)

func init() { addCommand(newSlicesCmd) }

// sourceFlags choose the machine: the live one or captures.
type sourceFlags struct {
	from   []string
	root   string
	noNVML bool
	node   string
}

func (f *sourceFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&f.from, "from", nil, "read captures of one machine instead of the live one (anything kiln inventory --from reads); repeat the flag or list more files after it")
	fl.StringVar(&f.root, "root", "/", "live discovery: the directory that stands for /")
	fl.BoolVar(&f.noNVML, "no-nvml", false, "live discovery: do not load NVML")
	fl.StringVar(&f.node, "node", os.Getenv("NODE_NAME"), "the Kubernetes node name (default $NODE_NAME, else the machine's host name)")
}

func (f *sourceFlags) options() discover.Options {
	return discover.Options{Root: f.root, SkipNVML: f.noNVML}
}

func newSlicesCmd() *cobra.Command {
	var src sourceFlags
	var format, sharedSpec string
	cmd := &cobra.Command{
		Use:   "slices [--from CAPTURE...] [--shared all|0,2] [-o json|yaml]",
		Short: "Print the ResourceSlices kiln would publish for this node or a recorded one",
		Long: `kiln-dra slices prints, as resource.k8s.io/v1 ResourceSlice objects, what the
kubelet plugin would publish for this machine (or for the captures given):
every GPU, MIG placement and AMD partition with its attributes, capacities,
shared counters and taints, so that an admin can review them before
installing the driver. Notes on what was left out go to standard error.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "json" && format != "yaml" {
				return &exitError{code: 3, err: fmt.Errorf("-o %s: want json or yaml", format)}
			}
			s, err := source.Load(cmd.Context(), append(src.from, args...), src.options())
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			if src.node == "" && dra.DNSSubdomain(s.Host.Hostname) == "" {
				return &exitError{code: 3, err: fmt.Errorf("the machine has no host name to use as its node name: give it with --node NAME")}
			}
			shared, err := dra.ParseShared(sharedSpec, s)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			r, err := dra.Build(cmd.Context(), dra.Input{Snapshot: s, NodeName: dra.DNSSubdomain(src.node), Shared: shared})
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			for _, n := range r.Notes {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
			}
			return writeList(cmd.OutOrStdout(), format, r.Objects())
		},
	}
	src.add(cmd)
	cmd.Flags().StringVarP(&format, "output", "o", "yaml", "output format: json or yaml")
	cmd.Flags().StringVar(&sharedSpec, "shared", "", "GPUs to show as fractions, as kiln-dra plugin --shared would publish them where the cluster enables DRAConsumableCapacity: all, or indices such as 0,2")
	return cmd
}

// writeList writes objects as a v1 List (JSON) or a YAML stream.
func writeList[T any](w io.Writer, format string, items []T) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	}
	for i, it := range items {
		b, err := yaml.Marshal(it)
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
