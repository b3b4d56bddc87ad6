//go:build !agentonly

package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

func init() { addCommand(newDrainCmd) }

func newDrainCmd() *cobra.Command {
	var cf clientFlags
	var reason string
	var undrain, clearLost bool
	cmd := &cobra.Command{
		Use:   "drain NODE [DEVICE...]",
		Short: "Take GPUs out of service (admins), put them back, or free what a lost node held",
		Long: `kiln drain stops new leases on a node's devices (all of them when none is named);
leases already running keep their GPUs. --undrain puts them back.

Agents drain devices with critical doctor findings by themselves; such drains end
when the finding goes away.

When a node is lost (no heartbeat), its leases are marked lost and its GPUs stay
held, because their jobs may still be running. When the node's agent registers
again, kiln stops those jobs and frees the GPUs. If the node will not come back,
--clear-lost frees them now.`,
		Example: `  kiln drain hgx-h100-03 gpu3 --reason "fan replaced, burn-in first"
  kiln drain hgx-h100-03 --undrain
  kiln drain gpu-pcie-07 --clear-lost`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if undrain && clearLost {
				return &exitError{code: 3, err: errors.New("--undrain and --clear-lost do different things: give one")}
			}
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			req := api.DrainRequest{Devices: args[1:], Reason: reason, Undrain: undrain, ClearLost: clearLost}
			n, err := c.DrainNode(cmd.Context(), args[0], req)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, n)
			}
			switch {
			case clearLost:
				fmt.Fprintf(cmd.OutOrStdout(), "freed the devices lost leases held on %s\n", printable(n.ID))
			case undrain:
				fmt.Fprintf(cmd.OutOrStdout(), "undrained on %s\n", printable(n.ID))
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "drained on %s\n", printable(n.ID))
			}
			writeNodeDevices(cmd.OutOrStdout(), *n)
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why (shown in kiln nodes)")
	cmd.Flags().BoolVar(&undrain, "undrain", false, "put the devices back in service")
	cmd.Flags().BoolVar(&clearLost, "clear-lost", false, "free the devices that lost leases still hold on the node")
	return cmd
}
