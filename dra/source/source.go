// Package source reads the Snapshot the DRA commands describe: the live
// machine, or captures of one machine, the same way kiln inventory --from
// reads them.
package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Load returns the Snapshot of the live machine (no paths, discovered with
// opts) or of the captures given, completed from the knowledge base.
// Captures that describe more than one machine are refused.
func Load(ctx context.Context, paths []string, opts discover.Options) (*snapshot.Snapshot, error) {
	var s *snapshot.Snapshot
	var err error
	if len(paths) == 0 {
		s, err = discover.Run(ctx, opts)
	} else {
		s, err = loadPaths(ctx, paths)
	}
	if err != nil {
		return nil, err
	}
	kb.Default().Annotate(s)
	return s, nil
}

func loadPaths(ctx context.Context, paths []string) (*snapshot.Snapshot, error) {
	var parts []capture.Part
	for _, p := range paths {
		parts = append(parts, read(ctx, p)...)
	}
	for _, p := range parts {
		if p.Err != nil {
			return nil, p.Err
		}
	}
	ms := capture.Machines(parts)
	switch len(ms) {
	case 0:
		return nil, errors.New("no capture given")
	case 1:
		return ms[0].Snapshot, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "these inputs look like %d machines, not one:", len(ms))
	for _, m := range ms {
		var ps []string
		for _, p := range m.Parts {
			ps = append(ps, p.Path)
		}
		fmt.Fprintf(&b, "\n  %s: %s (%s)", m.Label, strings.Join(ps, ", "), m.Why)
	}
	b.WriteString("\ngive the captures of one machine at a time")
	return nil, errors.New(b.String())
}

// read reads one path: a record bundle or snapshot JSON whole, anything
// else through the capture importers.
func read(ctx context.Context, p string) []capture.Part {
	if p == "-" {
		return capture.Read(ctx, p)
	}
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("%s: no such file or directory", p)
		}
		return []capture.Part{{Path: p, Err: err}}
	}
	switch {
	case st.IsDir() && discover.IsBundle(p):
		s, err := discover.Replay(ctx, p)
		if err != nil {
			err = fmt.Errorf("%s: replaying recorded bundle: %w", p, err)
		}
		return []capture.Part{{Path: p, Kind: "kiln-record", Bundle: p, Snapshot: s, Err: err}}
	case !st.IsDir() && isSnapshotJSON(p):
		s, err := decodeFile(p)
		return []capture.Part{{Path: p, Kind: "kiln-snapshot", Snapshot: s, Err: err}}
	}
	return capture.Read(ctx, p)
}

func decodeFile(p string) (*snapshot.Snapshot, error) {
	fh, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	s, err := snapshot.Decode(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

func isSnapshotJSON(p string) bool {
	fh, err := os.Open(p)
	if err != nil {
		return false
	}
	defer fh.Close()
	buf := make([]byte, 512)
	n, _ := fh.Read(buf)
	b := bytes.TrimLeft(buf[:n], " \t\r\n")
	return len(b) > 0 && b[0] == '{' && bytes.Contains(b, []byte(`"schema_version"`))
}
