package kmsg

import (
	"bytes"
	"os"
	"testing"
)

func BenchmarkParseBootLog(b *testing.B) {
	data, err := os.ReadFile(captures + "h100-hgx-boot-dmesg-iso.log")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
