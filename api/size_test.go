package api

import "testing"

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		r           LeaseRequest
		long, short string
	}{
		{LeaseRequest{GPUs: 1}, "1 GPU", "1 GPU"},
		{LeaseRequest{GPUs: 8}, "8 GPUs", "8 GPUs"},
		{LeaseRequest{Fraction: 0.25}, "0.25 of a GPU", "0.25 GPU"},
		{LeaseRequest{MIG: "1g.10gb"}, "MIG instance 1g.10gb", "MIG 1g.10gb"},
	} {
		if got := tc.r.Size(); got != tc.long {
			t.Errorf("%+v: Size %q, want %q", tc.r, got, tc.long)
		}
		if got := tc.r.ShortSize(); got != tc.short {
			t.Errorf("%+v: ShortSize %q, want %q", tc.r, got, tc.short)
		}
	}
}
