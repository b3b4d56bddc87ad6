// Package source reads the Snapshot a command describes: the live machine,
// or captures, snapshot JSON files and record bundles of one machine. It is
// what `--from` means for kiln's commands and for kiln-dra.
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
// opts) or of the captures given, completed from the knowledge base (KFD
// and lspci give only PCI ids). Captures that describe more than one
// machine are refused.
func Load(ctx context.Context, paths []string, opts discover.Options) (*snapshot.Snapshot, error) {
	var s *snapshot.Snapshot
	var err error
	if len(paths) == 0 {
		s, err = discover.Run(ctx, opts)
	} else {
		s, err = OneMachine(ctx, paths)
	}
	if err != nil {
		return nil, err
	}
	kb.Default().Annotate(s)
	return s, nil
}

// OneMachine reads captures, snapshot JSON files and record bundles, and
// merges them as one machine. Inputs that look like several machines are
// refused with the reason: merged, they would describe a machine that does
// not exist.
func OneMachine(ctx context.Context, paths []string) (*snapshot.Snapshot, error) {
	parts := Parts(ctx, paths)
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
	return nil, severalMachines(ms)
}

// severalMachines is the refusal for inputs of more than one machine.
func severalMachines(ms []capture.Machine) error {
	var b strings.Builder
	fmt.Fprintf(&b, "these inputs look like %d machines, not one:", len(ms))
	for _, m := range ms {
		var paths []string
		for _, p := range m.Parts {
			paths = append(paths, p.Path)
		}
		fmt.Fprintf(&b, "\n  %s: %s (%s)", m.Label, strings.Join(paths, ", "), m.Why)
	}
	b.WriteString("\ngive the captures of one machine at a time (kiln doctor audits several machines in one run)")
	return errors.New(b.String())
}

// Parts reads every path into the captures it holds: record bundles and
// snapshot JSON files whole, everything else through the capture importers;
// "-" is standard input.
func Parts(ctx context.Context, paths []string) []capture.Part {
	var parts []capture.Part
	for _, p := range paths {
		if p == "-" {
			parts = append(parts, capture.Read(ctx, p)...)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				err = fmt.Errorf("%s: no such file or directory", p)
			}
			parts = append(parts, capture.Part{Path: p, Err: err})
			continue
		}
		switch {
		case st.IsDir() && discover.IsBundle(p):
			s, err := discover.Replay(ctx, p)
			if err != nil {
				err = fmt.Errorf("%s: replaying recorded bundle: %w", p, err)
			}
			parts = append(parts, capture.Part{Path: p, Kind: "kiln-record", Bundle: p, Snapshot: s, Err: err})
		case !st.IsDir() && isSnapshotJSON(p):
			s, err := decodeSnapshotFile(p)
			parts = append(parts, capture.Part{Path: p, Kind: "kiln-snapshot", Snapshot: s, Err: err})
		default:
			parts = append(parts, capture.Read(ctx, p)...)
		}
	}
	return parts
}

func decodeSnapshotFile(p string) (*snapshot.Snapshot, error) {
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

// isSnapshotJSON peeks for kiln's schema_version key.
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
