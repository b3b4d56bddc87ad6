package doctor_test

import (
	"context"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
)

// BenchmarkDoctor8GPU runs every check over the Snapshot of a real 8-GPU
// HGX H100 (lspci -vvv and the boot log merged: 517 PCI functions).
func BenchmarkDoctor8GPU(b *testing.B) {
	s, err := capture.Load(context.Background(),
		"../testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt",
		"../testdata/captures/dmesg/h100-hgx-boot-dmesg-iso.log")
	if err != nil {
		b.Fatal(err)
	}
	if len(s.GPUs) != 8 {
		b.Fatalf("snapshot has %d GPUs", len(s.GPUs))
	}
	k := kb.Default()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rep, err := doctor.Run(context.Background(), s, k)
		if err != nil || rep.Checks == 0 {
			b.Fatal(err)
		}
	}
}
