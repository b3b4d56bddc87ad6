package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/dra"
)

func init() { addCommand(newClassesCmd) }

func newClassesCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "classes [-o yaml|json]",
		Short: "Print the DeviceClasses of gpu.kiln.dev (whole GPUs, MIG devices, AMD partitions)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "json" && format != "yaml" {
				return &exitError{code: 3, err: fmt.Errorf("-o %s: want json or yaml", format)}
			}
			return writeList(cmd.OutOrStdout(), format, dra.DeviceClasses())
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "yaml", "output format: json or yaml")
	return cmd
}
