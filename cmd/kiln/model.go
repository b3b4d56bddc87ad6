//go:build !agentonly

package main

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/serving/modeldir"
	"kiln.dev/kiln/serving/modelstore"
	"kiln.dev/kiln/units"
)

func init() { addCommand(newModelCmd) }

func newModelCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Keep models in the lab's OCI registry, for kiln serve",
		Long: `kiln model keeps models in the lab's own registry (any OCI registry: Debian's
docker-registry, Harbor, Zot), for labs without the internet. A model is an OCI
artifact (artifactType ` + modelstore.ArtifactType + `): its config is
what kiln read of the model (format, precision, shape, the weights' size) and its
layers are its files, one a file, uncompressed, each by its digest, so a file two
models share is stored and sent once. 'kiln serve REGISTRY/REPO:TAG' deploys one:
the node's agent pulls it once into its cache, checks every file's digest, and the
engines of every deployment of it share that copy.

Registries on loopback or private addresses are reached over plain HTTP when
they do not speak TLS; --insecure allows it for any. Credentials come from the
docker configuration (~/.docker/config.json), as docker login writes it.`,
	}
	cmd.AddCommand(newModelPushCmd(), newModelLsCmd(), newModelRmCmd(), newModelInspectCmd())
	return cmd
}

// modelProgress draws the push's or pull's progress on a terminal.
func modelProgress(w io.Writer) (func(phase string, done, total int64), func()) {
	if !colorOK(w) {
		return nil, func() {}
	}
	var mu sync.Mutex
	bar := &progressBar{w: w, width: terminalWidth()}
	return func(phase string, done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			bar.update(int(done>>20), int(total>>20), fmt.Sprintf("%s, %s of %s", phase, units.BytesRounded(uint64(done), 1), units.BytesRounded(uint64(total), 1)))
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			bar.clear()
		}
}

func newModelPushCmd() *cobra.Command {
	var insecure bool
	var name string
	cmd := &cobra.Command{
		Use:   "push DIR|FILE REGISTRY/REPOSITORY:TAG",
		Short: "Store a model (a Hugging Face folder or a GGUF file) in the lab's registry",
		Long: `kiln model push reads the model as kiln serve does (config.json and its
safetensors shards, or a GGUF file's header), hashes every file, and sends the
registry the files it does not hold yet: every regular file of the folder, links
into a Hugging Face cache followed, hidden files and folders left out. It prints
the artifact's digest.`,
		Example: `  kiln model push ~/models/Meta-Llama-3-8B-Instruct registry.lab:5000/models/llama-3:8b-instruct
  kiln model push ./qwen2.5-7b-q4_k_m.gguf registry.lab:5000/models/qwen2.5:7b-q4`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := modeldir.Read(args[0], name)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			m.Name = serving.DefaultName(m.Name)
			progress, done := modelProgress(cmd.ErrOrStderr())
			digest, err := modelstore.Push(cmd.Context(), m, args[1], modelstore.Options{Insecure: insecure, Progress: progress})
			done()
			if err != nil {
				return &exitError{code: 2, err: errors.New(printable(err.Error()))}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s@%s\n", printable(args[1]), digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry")
	cmd.Flags().StringVar(&name, "name", "", "the model's name in its config (default: the folder's or file's name)")
	return cmd
}

func newModelLsCmd() *cobra.Command {
	var insecure bool
	var format string
	cmd := &cobra.Command{
		Use:     "ls REGISTRY/REPOSITORY",
		Short:   "List the models of a repository, a tag each",
		Example: `  kiln model ls registry.lab:5000/models/llama-3`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", format, "text", "json", "yaml"); err != nil {
				return err
			}
			ls, err := modelstore.List(cmd.Context(), args[0], modelstore.Options{Insecure: insecure})
			if err != nil {
				return &exitError{code: 2, err: errors.New(printable(err.Error()))}
			}
			if format != "text" {
				if ls == nil {
					ls = []modelstore.Artifact{}
				}
				return writeStructured(cmd.OutOrStdout(), format, ls)
			}
			if len(ls) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no kiln models")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tNAME\tFORMAT\tFILES\tSIZE\tDIGEST")
			for _, a := range ls {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", cell(a.Ref), cell(a.Config.Model.Name), cell(a.Config.Model.Format),
					len(a.Config.Files), units.BytesRounded(uint64(a.Size), 1), cell(a.Digest))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry")
	cmd.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

func newModelInspectCmd() *cobra.Command {
	var insecure bool
	var format string
	cmd := &cobra.Command{
		Use:     "inspect REGISTRY/REPOSITORY:TAG",
		Short:   "Show a stored model's config: what kiln serve sizes it by, and its files",
		Example: `  kiln model inspect registry.lab:5000/models/llama-3:8b-instruct -o json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", format, "text", "json", "yaml"); err != nil {
				return err
			}
			a, err := modelstore.Inspect(cmd.Context(), args[0], modelstore.Options{Insecure: insecure})
			if err != nil {
				return &exitError{code: 2, err: errors.New(printable(err.Error()))}
			}
			if format != "text" {
				return writeStructured(cmd.OutOrStdout(), format, a)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s@%s\n", printable(a.Ref), a.Digest)
			fmt.Fprintf(w, "model %s: %s, %s of weights\n", printable(a.Config.Model.Name), printable(a.Config.Model.Format), units.BytesRounded(uint64(a.Config.Model.WeightsBytes), 1))
			for _, f := range a.Config.Files {
				fmt.Fprintf(w, "  %-40s %10s  %s\n", printable(f.Path), units.BytesRounded(uint64(f.Size), 1), f.Digest)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry")
	cmd.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

func newModelRmCmd() *cobra.Command {
	var insecure bool
	cmd := &cobra.Command{
		Use:   "rm REGISTRY/REPOSITORY:TAG...",
		Short: "Remove models from the registry",
		Long: `kiln model rm deletes each model's manifest. Its files stay in the registry
until its garbage collection runs, and other models may share them; nodes keep
their cached copy until their cache evicts it.`,
		Example: `  kiln model rm registry.lab:5000/models/llama-3:8b-instruct`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, ref := range args {
				if err := modelstore.Remove(cmd.Context(), ref, modelstore.Options{Insecure: insecure}); err != nil {
					return &exitError{code: 2, err: errors.New(printable(err.Error()))}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", printable(ref))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP to the registry")
	return cmd
}
