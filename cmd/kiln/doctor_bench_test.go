package main

import (
	"bytes"
	"context"
	"testing"
)

// BenchmarkDoctorNvidiaSMI is kiln doctor -o json on an 8-GPU nvidia-smi -q
// capture, in-process: what one run allocates, from reading the file to the
// report (bench/doctor measures the whole process).
func BenchmarkDoctorNvidiaSMI(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var out, errb bytes.Buffer
		run(context.Background(), []string{"doctor", "-o", "json", "--from", capturesDir + "/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"}, &out, &errb)
	}
}
