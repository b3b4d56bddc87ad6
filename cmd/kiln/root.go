package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:           "kiln",
		Short:         "kiln: mismatched GPU servers turned into a dependable GPU service",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log what kiln reads, to standard error")
	root.SetOut(stdout)
	root.SetErr(stderr)
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

// commands are the subcommands; each command's file adds itself in init.
var commands []func() *cobra.Command

func addCommand(c func() *cobra.Command) { commands = append(commands, c) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exitError); ok && ee.err == nil {
		return ee.code
	}
	fmt.Fprintln(stderr, "kiln:", printableLines(err.Error()))
	return exitCode(err)
}
