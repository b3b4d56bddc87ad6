package kb

import "testing"

// BenchmarkLoad is what every command that reads the knowledge base pays
// at its first lookup (the Xid catalogue and the compat tables are read
// later, on first use).
func BenchmarkLoad(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(dataFS); err != nil {
			b.Fatal(err)
		}
	}
}
