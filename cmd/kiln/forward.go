//go:build !agentonly

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

func init() { addCommand(newForwardCmd) }

func newForwardCmd() *cobra.Command {
	var cf clientFlags
	var address, job string
	var rank int
	var browser bool
	cmd := &cobra.Command{
		Use:   "forward LEASE PORT [LOCAL_PORT]",
		Short: "Reach a port a job listens on from this machine, through the server",
		Long: `kiln forward listens on LOCAL_PORT (default PORT) of this machine and carries
each connection to PORT of a job in the lease: through the server, then the
node's agent, over the connections they keep to each other (TLS). Nothing on
the node listens for kiln, so nodes that only the server reaches are reached.
Any TCP protocol passes: HTTP, WebSockets, gRPC, a database, ssh.

The job must declare the port ('kiln run --port 8000'); the newest job of the
lease that declares it is reached, or --job. Only the lease's owner and
admins may forward its ports. kiln forward ends when the lease ends; a
connection idle for the server's idle time (30 minutes) is closed.

With --browser, kiln forward prints a link instead, to the server's HTTP path
for the port (https://SERVER/v1/leases/LEASE/ports/PORT/http/): opened once in a
browser within two minutes, it leaves a session cookie for that path alone.
The app sees the path prefix in X-Forwarded-Prefix.`,
		Example: `  kiln run --gpus 1 --port 8000 -d --image vllm/vllm-openai -- --model /models/llama
  kiln forward l-1a2b3c 8000              # then: curl localhost:8000/v1/models
  kiln forward l-1a2b3c 8888 9999         # Jupyter on port 8888 at localhost:9999
  kiln forward --browser l-1a2b3c 6006    # TensorBoard in a browser, through https://SERVER/...`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := portArg("PORT", args[1])
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			local := port
			if len(args) == 3 && args[2] == "0" {
				local = 0 // any free port
			} else if len(args) == 3 {
				if local, err = portArg("LOCAL_PORT", args[2]); err != nil {
					return &exitError{code: 3, err: err}
				}
			}
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if browser {
				link, err := c.BrowserLink(ctx, args[0], port)
				if err != nil {
					return apiErr(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), link.URL)
				fmt.Fprintf(cmd.ErrOrStderr(), "kiln: open this link in a browser before %s; it works once, then the browser keeps a session for 8 hours\n", link.Expires.Local().Format(time.Kitchen))
				return nil
			}
			l, err := c.GetLease(ctx, args[0], api.LeaseWait{})
			if err != nil {
				return apiErr(err)
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(local)))
			if err != nil {
				return &exitError{code: 3, err: fmt.Errorf("listening on %s: %w", net.JoinHostPort(address, strconv.Itoa(local)), err)}
			}
			f := &forwarder{c: c, lease: l.ID, port: port, job: job, rank: rank, errw: cmd.ErrOrStderr()}
			fmt.Fprintf(cmd.ErrOrStderr(), "kiln: forwarding %s to port %d of lease %s (Ctrl-C to stop)\n", ln.Addr(), port, printable(l.ID))
			return f.serve(ctx, ln)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on (0.0.0.0 lets other machines use the forward)")
	cmd.Flags().StringVar(&job, "job", "", "the job to reach (default the lease's newest that declares the port)")
	cmd.Flags().IntVar(&rank, "rank", 0, "the task of a gang job to reach")
	cmd.Flags().BoolVar(&browser, "browser", false, "print a link that opens the port's HTTP server in a browser, through the server (no local listener)")
	return cmd
}

func portArg(name, v string) (int, error) {
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("%s %q: want a TCP port, 1 to 65535", name, printable(v))
	}
	return p, nil
}

// forwarder carries the connections of a local listener to a job's port.
type forwarder struct {
	c     *api.Client
	lease string
	port  int
	job   string
	rank  int
	errw  io.Writer
}

// serve accepts until ctx ends or the lease does.
func (f *forwarder) serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ended atomic.Pointer[api.Lease]
	go func() {
		// The lease's end ends the forward.
		key := ""
		for ctx.Err() == nil {
			l, err := f.c.GetLease(ctx, f.lease, api.LeaseWait{For: 30 * time.Second, Since: key})
			if err != nil {
				if !sleepCtx(ctx, time.Second) {
					return
				}
				continue
			}
			if api.LeaseFinal(l.State) {
				ended.Store(l)
				cancel()
				return
			}
			key = api.LeaseVersion(l)
		}
	}()
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if l := ended.Load(); l != nil {
				fmt.Fprintf(f.errw, "kiln: lease %s %s: forward ended\n", printable(l.ID), printable(l.State))
				return &exitError{code: 2}
			}
			if ctx.Err() != nil {
				return nil
			}
			return &exitError{code: 3, err: fmt.Errorf("accepting: %w", err)}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.carry(ctx, conn)
		}()
	}
}

// carry joins one local connection to the job's port.
func (f *forwarder) carry(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	st, err := f.c.ConnectPort(ctx, f.lease, f.port, f.job, f.rank)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			fmt.Fprintf(f.errw, "kiln: connection from %s: %s\n", conn.RemoteAddr(), printable(err.Error()))
		}
		return
	}
	stop := context.AfterFunc(ctx, func() { st.Close(); conn.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(st, conn)
		st.Close()
	}()
	_, _ = io.Copy(conn, st)
	conn.Close()
	<-done
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
