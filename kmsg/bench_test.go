package kmsg

import (
	"bytes"
	"os"
	"path/filepath"
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

// BenchmarkParseCorpus reads every kernel log of the corpus, one after the
// other: the mix of forms, wrappers and events a 50 MB log is made of in
// bench/doctor.
func BenchmarkParseCorpus(b *testing.B) {
	files, err := filepath.Glob(captures + "*.log")
	if err != nil || len(files) == 0 {
		b.Fatal("no logs", err)
	}
	var data []byte
	for _, f := range files {
		d, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		data = append(append(data, d...), '\n')
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
