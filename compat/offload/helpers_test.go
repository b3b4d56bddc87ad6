package offload

import (
	"io"
	"slices"
)

// Scan reads one file with a Scanner of its own.
func Scan(r io.Reader, size int64) (*Result, error) {
	var s Scanner
	return s.Scan(r, size)
}

// KnownProcessor reports whether p is a processor of the EF_AMDGPU_MACH
// table.
func KnownProcessor(p string) bool { return machByName[p] != nil }

// IsGeneric reports whether p is a generic target (gfx9-generic ...).
func IsGeneric(p string) bool { return genericMembers[p] != nil }

// GenericMembers returns the processors a generic target runs on, nil for a
// processor that is not generic.
func GenericMembers(p string) []string { return slices.Clone(genericMembers[p]) }
