package fatbin

import "io"

// Scan reads one file with a Scanner of its own.
func Scan(r io.Reader, size int64) (*ELFResult, error) {
	var s Scanner
	return s.Scan(r, size)
}
