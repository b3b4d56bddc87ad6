package offload

import (
	"bytes"
	"testing"
)

// BenchmarkScan reads a 256 MB ELF stream, mostly host code, whose
// .hip_fatbin holds a few uncompressed and compressed bundles.
func BenchmarkScan(b *testing.B) {
	text := make([]byte, 256<<20)
	x := uint32(1)
	for i := range text {
		x = x*1664525 + 1013904223
		text[i] = byte(x >> 24)
	}
	bundle := torchLike()
	var parts [][]byte
	for i := 0; i < 4; i++ {
		parts = append(parts, bundle, mustCompress(b, bundle, 2, MethodZstd, 0), mustCompress(b, bundle, 3, MethodZlib, 0))
	}
	elfb := BuildELF(text, pad(parts...))
	text = nil
	var sc Scanner
	b.SetBytes(int64(len(elfb)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := sc.Scan(bytes.NewReader(elfb), int64(len(elfb)))
		if err != nil || res.Bundles != 12 || res.String() != "gfx1100 gfx90a:xnack- gfx942" {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
