package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
)

// sessionDrain bounds how long a session's output is read after its
// command ended (what it started in the background may hold its output
// open).
const sessionDrain = time.Second

// serveSession runs the ordered command beside the job (kiln exec, kiln
// shell) and carries its terminal or its input and output as session
// frames.
func (a *Agent) serveSession(ctx context.Context, o api.TunnelOrder) {
	refuse := func(err error) {
		if rerr := a.client.RefuseTunnel(ctx, a.node, o.ID, err.Error()); rerr != nil {
			a.log.Debug("refusing a session", "tunnel", o.ID, "err", rerr)
		}
	}
	req := o.Session.SessionRequest
	if err := req.Check(); err != nil {
		refuse(fmt.Errorf("session: %w", err))
		return
	}
	_, h, err := a.runningJob(o.JobID)
	if err != nil {
		refuse(err)
		return
	}
	ex, ok := h.(executor.Execer)
	if !ok {
		refuse(fmt.Errorf("the jobs of this node's %s executor open no sessions yet", a.cfg.Executor.Name()))
		return
	}
	sess, err := ex.Exec(ctx, executor.ExecSpec{Command: req.Command, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Term: req.Term})
	if err != nil {
		refuse(err)
		return
	}
	defer sess.Close()
	st, err := a.client.AcceptTunnel(ctx, a.node, o.ID)
	if err != nil {
		a.log.Debug("opening a session's stream", "tunnel", o.ID, "err", err)
		return
	}
	defer st.Close()
	started := time.Now()
	a.log.Info("session opened", "tunnel", o.ID, "job", o.JobID, "user", o.Session.User, "tty", req.TTY)
	fw := api.NewFrameWriter(st)
	var outs sync.WaitGroup
	pump := func(kind byte, r io.Reader) {
		defer outs.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 && fw.Write(kind, buf[:n]) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}
	outs.Add(1)
	go pump(api.FrameStdout, sess.Stdout())
	if r := sess.Stderr(); r != nil {
		outs.Add(1)
		go pump(api.FrameStderr, r)
	}
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		if err := sessionInput(st, sess); err != nil {
			a.log.Debug("session input", "tunnel", o.ID, "err", err)
		}
	}()
	exit, err := sess.Wait(ctx)
	if err != nil {
		return // the agent stops
	}
	drained := make(chan struct{})
	go func() { outs.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(sessionDrain):
	}
	sess.Close()
	<-drained
	se := api.SessionExit{Code: exit.Code, Signal: exit.Signal}
	if exit.Reason != "" && exit.Reason != "exited" {
		se.Reason = exit.Reason
	} else if jobEnded(ctx, h) {
		se.Reason = "the job ended"
	}
	_ = fw.WriteJSON(api.FrameExit, se)
	_ = st.CloseWrite()
	// The server ends the stream once it passed the exit on; closing it
	// before would reset it, and what is in flight with it.
	select {
	case <-inputDone:
	case <-time.After(5 * time.Second):
	}
	a.log.Info("session closed", "tunnel", o.ID, "job", o.JobID, "user", o.Session.User, "code", se.Code, "after", time.Since(started).Round(time.Millisecond))
}

// sessionInput passes the user's frames to the session until the stream
// ends, which ends the session.
func sessionInput(r io.Reader, sess executor.Session) error {
	defer sess.Close()
	br := bufio.NewReaderSize(r, 32<<10)
	buf := make([]byte, api.MaxFrame)
	for {
		kind, p, err := api.ReadFrame(br, buf)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch kind {
		case api.FrameStdin:
			if _, err := sess.Stdin().Write(p); err != nil {
				return fmt.Errorf("the session's input: %w", err)
			}
		case api.FrameEOF:
			sess.Stdin().Close()
		case api.FrameResize:
			rows, cols, err := api.ParseResize(p)
			if err != nil {
				return err
			}
			_ = sess.Resize(rows, cols)
		case api.FrameSignal:
			if !slices.Contains(api.SessionSignals, string(p)) {
				return fmt.Errorf("signal %q: want one of %v", p, api.SessionSignals)
			}
			_ = sess.Signal(string(p))
		default:
			return fmt.Errorf("a session frame of kind %q from the user", kind)
		}
	}
}

// jobEnded says whether the job's handle is done.
func jobEnded(ctx context.Context, h executor.Handle) bool {
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := h.Wait(wctx)
	return err == nil
}
