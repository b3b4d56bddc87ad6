//go:build !agentonly

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kiln.dev/kiln/api"
)

// Backends of kiln server: where leases run.
const (
	backendAgents     = "agents"
	backendKubernetes = "kubernetes"
)

// joinTokenMaker is the part of the server the Kubernetes backend needs.
type joinTokenMaker interface {
	CreateJoinToken(ctx context.Context, ttl time.Duration, uses int, by string) (api.JoinToken, error)
	CAFingerprint() string
}

// kubeBackend runs 'kiln-dra agents' beside the server: every node of the
// cluster that publishes gpu.kiln.dev devices joins the server as a kiln
// node, and its jobs run as ResourceClaims and Pods. The Kubernetes client
// libraries stay in kiln-dra, off the path of kiln's other commands.
type kubeBackend struct {
	dra        string // the kiln-dra executable
	kubeconfig string
	prefix     string
	watch      time.Duration
	// unschedulable is how long a job's Pod may stay unschedulable
	// before its job ends with the scheduler's reason.
	unschedulable time.Duration
	dir           string // identities of the cluster's nodes and the join token file
	url           string // the server as the backend reaches it
	srv           joinTokenMaker
	log           *slog.Logger
}

// Join tokens the backend is given: renewed every tokenRenew, each valid
// for twice that, so that the file always holds a live one.
const (
	tokenRenew = time.Hour
	tokenUses  = 10000
)

// backendURL is how a process on the server's host reaches it: on
// loopback when the server listens on every address or on loopback (the
// server's certificate names 127.0.0.1 and ::1), else at url.
func backendURL(ln net.Addr, url string) string {
	host, port, err := net.SplitHostPort(ln.String())
	if err != nil {
		return url
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return url
	case ip.IsUnspecified() || ip.To4() != nil && ip.IsLoopback():
		return "https://" + net.JoinHostPort("127.0.0.1", port)
	case ip.IsLoopback():
		return "https://" + net.JoinHostPort("::1", port)
	}
	return url
}

// run keeps kiln-dra agents running until ctx ends: a process that exits
// is started again after a pause that grows while it keeps failing.
func (b *kubeBackend) run(ctx context.Context) {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		b.log.Error("kubernetes backend: cannot keep its state", "dir", b.dir, "err", err)
		return
	}
	tokenFile := filepath.Join(b.dir, "join-token")
	renewed := make(chan error, 1)
	go b.renewTokens(ctx, tokenFile, renewed)
	if err := <-renewed; err != nil {
		b.log.Error("kubernetes backend: no join token for the cluster's nodes", "err", err)
		return
	}
	pause := time.Second
	for ctx.Err() == nil {
		started := time.Now()
		err := b.once(ctx, tokenFile)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			pause = time.Second
		}
		b.log.Error("kubernetes backend stopped; starting it again", "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Minute)
	}
}

// once runs kiln-dra agents until it exits or ctx ends.
func (b *kubeBackend) once(ctx context.Context, tokenFile string) error {
	args := []string{"agents", "--url", b.url, "--token-file", tokenFile, "--ca-sha256", b.srv.CAFingerprint(),
		"--state", b.dir, "--namespace-prefix", b.prefix, "--watch", b.watch.String()}
	if b.unschedulable > 0 {
		args = append(args, "--unschedulable", b.unschedulable.String())
	}
	if b.kubeconfig != "" {
		args = append(args, "--kubeconfig", b.kubeconfig)
	}
	c := exec.CommandContext(ctx, b.dra, args...)
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = 15 * time.Second
	c.Env = backendEnv(os.Environ())
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	b.log.Info("kubernetes backend starting", "program", b.dra, "server", b.url)
	if err := c.Run(); err != nil {
		return fmt.Errorf("%s agents: %w", b.dra, err)
	}
	return errors.New(b.dra + " agents exited")
}

// renewTokens writes a fresh join token to path now and every tokenRenew;
// the first outcome goes to first.
func (b *kubeBackend) renewTokens(ctx context.Context, path string, first chan<- error) {
	for {
		err := b.writeToken(ctx, path)
		if first != nil {
			first <- err
			first = nil
		} else if err != nil {
			b.log.Error("kubernetes backend: renewing its join token", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tokenRenew):
		}
	}
}

// writeToken replaces the token file, readable by the server's user alone.
func (b *kubeBackend) writeToken(ctx context.Context, path string) error {
	jt, err := b.srv.CreateJoinToken(ctx, 2*tokenRenew, tokenUses, "the Kubernetes backend")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".join-token-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(jt.Secret + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// backendEnv is the server's environment less the credentials of kiln's
// users, which the backend has no use for.
func backendEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "KILN_TOKEN", "KILN_CONFIG", "KILN_JOIN_TOKEN":
			continue
		}
		out = append(out, kv)
	}
	return out
}
