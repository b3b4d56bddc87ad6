// Package units writes byte counts as text in binary units, the way kiln
// prints memory sizes everywhere.
package units

import "strconv"

const (
	mib = 1 << 20
	gib = 1 << 30
)

// Bytes writes b in GiB from 1 GiB up, with as many decimals as it takes to
// be exact ("8 GiB", "19.5 GiB", "1.00048828125 GiB"), and below that in
// whole MiB, rounded to the nearest (a tie to even: "512 MiB", "0 MiB"). It is the text for a size that
// was asked for, which the reader should see as given: kiln's lease server
// writes a request's memory this way.
func Bytes(b uint64) string { return BytesRounded(b, -1) }

// BytesRounded writes b like Bytes but rounds GiB to the given number of
// decimals ("79.6 GiB" with 1, "80 GiB" with 0); decimals below 0 mean as
// many as it takes to be exact. It is the text for a size that was
// measured, such as a GPU's memory.
func BytesRounded(b uint64, decimals int) string {
	if decimals < 0 {
		decimals = -1
	}
	if b >= gib {
		return strconv.FormatFloat(float64(b)/gib, 'f', decimals, 64) + " GiB"
	}
	return strconv.FormatFloat(float64(b)/mib, 'f', 0, 64) + " MiB"
}
