package units

import (
	"strconv"
	"testing"
)

// serverBytesText is the text kiln's lease server wrote for a memory size
// before this package (placement's bytesText, without its "a share" for 0):
// Bytes must stay the same text.
func serverBytesText(b uint64) string {
	if b >= 1<<30 {
		return strconv.FormatFloat(float64(b)/(1<<30), 'f', -1, 64) + " GiB"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 0, 64) + " MiB"
}

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		b    uint64
		want string
	}{
		{0, "0 MiB"},
		{1, "0 MiB"},
		{512 << 10, "0 MiB"},  // a tie rounds to even, as strconv does
		{1536 << 10, "2 MiB"}, // and up here
		{1 << 20, "1 MiB"},
		{512 << 20, "512 MiB"},
		{1023 << 20, "1023 MiB"},
		{1 << 30, "1 GiB"},
		{8 << 30, "8 GiB"},
		{19968 << 20, "19.5 GiB"},
		{1<<30 + 1<<19, "1.00048828125 GiB"},
		{81559 << 20, "79.6474609375 GiB"},
		{192 << 30, "192 GiB"},
		{1 << 62, "4294967296 GiB"},
	} {
		if got := Bytes(tc.b); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.b, got, tc.want)
		}
		if got := serverBytesText(tc.b); got != Bytes(tc.b) {
			t.Errorf("Bytes(%d) = %q, the server wrote %q", tc.b, Bytes(tc.b), got)
		}
	}
}

func TestBytesRounded(t *testing.T) {
	for _, tc := range []struct {
		b        uint64
		decimals int
		want     string
	}{
		{81559 << 20, 1, "79.6 GiB"},
		{81559 << 20, 0, "80 GiB"},
		{80 << 30, 1, "80.0 GiB"},
		{80 << 30, 0, "80 GiB"},
		{19968 << 20, -1, "19.5 GiB"},
		{19968 << 20, -5, "19.5 GiB"},
		{24 << 30, 2, "24.00 GiB"},
		{512 << 20, 1, "512 MiB"},
		{0, 0, "0 MiB"},
	} {
		if got := BytesRounded(tc.b, tc.decimals); got != tc.want {
			t.Errorf("BytesRounded(%d, %d) = %q, want %q", tc.b, tc.decimals, got, tc.want)
		}
	}
}

// FuzzBytes: Bytes is the server's text for every size.
func FuzzBytes(f *testing.F) {
	for _, b := range []uint64{0, 1, 1 << 20, 1<<30 - 1, 1 << 30, 19968 << 20, ^uint64(0)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b uint64) {
		if got, want := Bytes(b), serverBytesText(b); got != want {
			t.Fatalf("Bytes(%d) = %q, the server wrote %q", b, got, want)
		}
	})
}
