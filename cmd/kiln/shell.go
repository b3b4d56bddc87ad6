//go:build !agentonly

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"kiln.dev/kiln/api"
)

func init() {
	addCommand(newShellCmd)
	addCommand(newExecCmd)
}

// sessionFlags pick where a session runs.
type sessionFlags struct {
	job  string
	rank int
}

func (f *sessionFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.job, "job", "", "the job to run beside (default the lease's newest running job)")
	cmd.Flags().IntVar(&f.rank, "rank", 0, "the task of a gang job to run beside (its node)")
}

func newShellCmd() *cobra.Command {
	var cf clientFlags
	var sf sessionFlags
	var shell string
	cmd := &cobra.Command{
		Use:   "shell LEASE",
		Short: "Open a terminal beside a lease's running job, on its node",
		Long: `kiln shell opens a shell on the node where a job of the lease runs, beside it:
as the job's user, with the job's environment (its GPUs, KILN_* variables, what
--env gave), its working directory, file system view (its /tmp), process
namespace and limits. The terminal is real (a PTY on the node): window resizes
pass, Ctrl-C stops what runs in it, Ctrl-D or 'exit' ends it, and kiln shell
exits with the shell's exit code.

It goes through the server and the node's agent, as kiln forward does: nothing
on the node listens for kiln. Only the lease's owner and admins open sessions;
each is recorded in the lease's events (who, when, how it ended), never what
is typed. The job's end or the lease's ends the session.

A lease runs jobs, so a shell needs one that runs: start a holder with
'kiln run -d --lease LEASE -- sleep infinity', or use 'kiln run -it'. For a
command without a terminal (scripts, pipes), use kiln exec.`,
		Example: `  kiln shell l-1a2b3c
  kiln shell l-1a2b3c --rank 1            # the second node of a gang
  kiln shell l-1a2b3c --shell /bin/zsh`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var command []string
			if shell != "" {
				command = []string{shell}
			}
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			return runSessionCmd(cmd, c, args[0], sf, command, true, true, 0)
		},
	}
	cf.add(cmd)
	sf.add(cmd)
	cmd.Flags().StringVar(&shell, "shell", "", "the shell to run (default bash, else sh, on the node)")
	return cmd
}

func newExecCmd() *cobra.Command {
	var cf clientFlags
	var sf sessionFlags
	var stdin, tty bool
	cmd := &cobra.Command{
		Use:   "exec LEASE [-i] [-t] -- CMD [ARG...]",
		Short: "Run a command beside a lease's running job, with its environment",
		Long: `kiln exec runs CMD on the node where a job of the lease runs, beside it, as
the job's user with its environment, working directory, file system view,
process namespace and limits, and passes its output and error output here.
It exits with the command's exit code (128+N when a signal N ended it).

-i passes this side's input to the command (without it, the command's input
is empty); -t gives it a terminal (a PTY on the node; this side's must be a
terminal too), as kiln shell does. Without -t, Ctrl-C here sends SIGINT to the
command, and a second Ctrl-C leaves it.

Sessions go through the server and the node's agent. Only the lease's owner
and admins open them; each is recorded in the lease's events (who, when, the
program's name), never its arguments, input or output.`,
		Example: `  kiln exec l-1a2b3c -- nvidia-smi
  kiln exec l-1a2b3c -- sh -c 'tail -n 50 train.log'
  kiln exec -i l-1a2b3c -- python - < probe.py
  kiln exec -it l-1a2b3c -- htop`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			return runSessionCmd(cmd, c, args[0], sf, args[1:], stdin || tty, tty, 0)
		},
	}
	cf.add(cmd)
	sf.add(cmd)
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "pass this side's standard input to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "give the command a terminal (implies -i)")
	return cmd
}

// runSessionCmd opens a session on lease and carries it here: with tty,
// on this side's terminal (raw, resizes passed); it returns the command's
// exit code as the process's.
// A lease whose job is not running yet is waited for up to wait.
func runSessionCmd(cmd *cobra.Command, c *api.Client, lease string, sf sessionFlags, command []string, withInput, tty bool, wait time.Duration) error {
	stderr := cmd.ErrOrStderr()
	in, _ := cmd.InOrStdin().(*os.File)
	req := api.SessionRequest{Command: command, TTY: tty}
	var ttyFD int
	if tty {
		if in == nil || !term.IsTerminal(int(in.Fd())) {
			return &exitError{code: 3, err: errors.New("a terminal session needs a terminal here (standard input is not one); for a command without one, use kiln exec without -t")}
		}
		ttyFD = int(in.Fd())
		if cols, rows, err := term.GetSize(ttyFD); err == nil {
			req.Rows, req.Cols = uint16(rows), uint16(cols)
		}
		req.Term = os.Getenv("TERM")
		if (api.SessionRequest{TTY: true, Term: req.Term}).Check() != nil {
			req.Term = ""
		}
	}
	if err := req.Check(); err != nil {
		return &exitError{code: 3, err: err}
	}
	// The session outlives the interrupt that cancels the command's
	// context: Ctrl-C here is the command's to take.
	ctx, cancel := context.WithCancel(context.WithoutCancel(cmd.Context()))
	defer cancel()
	st, fw, err := openSessionWhenUp(ctx, c, lease, sf, req, wait)
	if err != nil {
		return apiErr(err)
	}
	sio := api.SessionIO{Stdout: cmd.OutOrStdout(), Stderr: stderr}
	if withInput {
		sio.Stdin = cmd.InOrStdin()
	}
	resize := make(chan [2]uint16, 1)
	sigs := make(chan string, 1)
	sio.Resize, sio.Signal = resize, sigs
	osSigs := make(chan os.Signal, 4)
	signal.Notify(osSigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
	defer signal.Stop(osSigs)
	if tty {
		old, err := term.MakeRaw(ttyFD)
		if err != nil {
			st.Close()
			return &exitError{code: 3, err: fmt.Errorf("putting the terminal in raw mode: %w", err)}
		}
		defer term.Restore(ttyFD, old)
	}
	go func() {
		interrupts := 0
		for s := range osSigs {
			switch s {
			case syscall.SIGWINCH:
				if cols, rows, err := term.GetSize(ttyFD); tty && err == nil {
					select {
					case resize <- [2]uint16{uint16(rows), uint16(cols)}:
					default:
					}
				}
			case syscall.SIGINT:
				if interrupts++; interrupts > 1 || tty {
					cancel()
					continue
				}
				sigs <- "INT"
			default: // TERM, HUP: this side goes, and the session with it
				cancel()
			}
		}
	}()
	ex, err := api.RunSession(ctx, st, fw, sio)
	if tty {
		// Back to a cooked terminal before kiln speaks.
		fmt.Fprint(stderr, "\r")
	}
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: 130, err: errors.New("the session was left; its command is ended on the node")}
		}
		return &exitError{code: 3, err: err}
	}
	if ex.Reason != "" {
		fmt.Fprintf(stderr, "kiln: the session ended: %s\n", printable(ex.Reason))
	}
	if ex.Code != 0 {
		return &exitError{code: min(max(ex.Code, 1), 255)}
	}
	return nil
}

// sessionHolder is the job kiln run -i/-t starts to hold its lease while
// the session runs beside it (with --image, the image must have sleep:
// coreutils or busybox).
var sessionHolder = []string{"sleep", "infinity"}

// openSessionWhenUp opens a session, waiting up to wait while the lease's
// job is not running yet (409).
func openSessionWhenUp(ctx context.Context, c *api.Client, lease string, sf sessionFlags, req api.SessionRequest, wait time.Duration) (*api.Stream, *api.FrameWriter, error) {
	deadline := time.Now().Add(wait)
	for {
		st, fw, err := c.OpenSession(ctx, lease, sf.job, sf.rank, req)
		if err == nil || api.StatusOf(err) != http.StatusConflict || time.Now().After(deadline) {
			return st, fw, err
		}
		// The job it waits for ended (a holder the image cannot run):
		// waiting more opens nothing.
		if sf.job != "" {
			if j, jerr := c.GetJob(ctx, sf.job); jerr == nil && api.JobFinal(j.State) {
				why := j.State
				if j.ExitCode != nil {
					why += fmt.Sprintf(", exit code %d", *j.ExitCode)
				}
				if j.Reason != "" {
					why += ": " + j.Reason
				}
				return nil, nil, fmt.Errorf("job %s ended (%s) before the session opened; its output: kiln logs %s", j.ID, why, j.ID)
			}
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return nil, nil, ctx.Err()
		}
	}
}
