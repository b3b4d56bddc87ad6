package modeldir

import "testing"

func FuzzPrecision(f *testing.F) {
	f.Add([]byte(`{"torch_dtype":"bfloat16"}`))
	f.Add([]byte(`{"dtype":"float16","torch_dtype":""}`))
	f.Add([]byte(`{"torch_dtype":7}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := precision(b)
		if err != nil {
			return
		}
		switch p {
		case "", "bf16", "fp16", "fp32", "fp8":
		default:
			t.Fatalf("precision %q from %q", p, b)
		}
	})
}
