package api

import "fmt"

// Size says how much a lease asks for, in prose: "1 GPU", "2 GPUs",
// "0.25 of a GPU", "MIG instance 1g.10gb".
func (r LeaseRequest) Size() string { return r.size("of a GPU", "MIG instance ") }

// ShortSize is Size for a table: "0.25 GPU", "MIG 1g.10gb".
func (r LeaseRequest) ShortSize() string { return r.size("GPU", "MIG ") }

func (r LeaseRequest) size(fraction, mig string) string {
	switch {
	case r.GPUs == 1:
		return "1 GPU"
	case r.GPUs > 1:
		return fmt.Sprintf("%d GPUs", r.GPUs)
	case r.Fraction > 0:
		return fmt.Sprintf("%g %s", r.Fraction, fraction)
	}
	return mig + r.MIG
}
