package server

import "testing"

// TestParseExitGPU: a job's GPU use is taken within what GPUs can do and
// refused beyond it.
func TestParseExitGPU(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"code":0,"reason":"exited","gpu":{"peak_memory_bytes":85899345920,"mean_sm_percent":61.5,"samples":12,"sample_s":5}}`, true},
		{`{"code":0,"reason":"exited"}`, true},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"samples":-1,"sample_s":5}}`, false},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"mean_sm_percent":-3,"samples":1,"sample_s":5}}`, false},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"mean_sm_percent":1e9,"samples":1,"sample_s":5}}`, false},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1e18,"samples":1,"sample_s":5}}`, false},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"samples":1,"sample_s":1e9}}`, false},
		{`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"samples":1,"sample_s":5,"extra":1}}`, false},
	} {
		if _, err := parseExit([]byte(tc.body)); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.body, err, tc.ok)
		}
	}
}
