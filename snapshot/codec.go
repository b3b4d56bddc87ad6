package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Decode reads one Snapshot in JSON. It refuses a snapshot written by a
// newer schema than this kiln knows, and unknown fields, so that a typo in a
// hand-written fixture is an error, not a silently missing value.
func Decode(r io.Reader) (*Snapshot, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var s Snapshot
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if s.SchemaVersion == 0 {
		return nil, errors.New("snapshot: schema_version missing: this is not a kiln snapshot")
	}
	if s.SchemaVersion > SchemaVersion {
		return nil, fmt.Errorf("snapshot: schema_version %d is newer than this kiln understands (%d): upgrade kiln", s.SchemaVersion, SchemaVersion)
	}
	return &s, nil
}

// Encode writes s as indented JSON.
func Encode(w io.Writer, s *Snapshot) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
