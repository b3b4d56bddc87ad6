package server

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"kiln.dev/kiln/serving"
)

// readUsage passes body through a usageReader, in small reads, and gives
// what it counted and the bytes that came out.
func readUsage(t testing.TB, body string, stream bool) (prompt, compl int64, calls int, out []byte) {
	t.Helper()
	u := &usageReader{rc: io.NopCloser(iotest.HalfReader(strings.NewReader(body))), stream: stream,
		done: func(p, c int64) { prompt, compl, calls = p, c, calls+1 }}
	out, err := io.ReadAll(u)
	if err != nil {
		t.Fatal(err)
	}
	u.Close()
	return prompt, compl, calls, out
}

// The endpoint counts the tokens an engine reports: a JSON answer's usage,
// or the usage event of a stream (split across reads, with CRLF lines), and
// counts each answer once; what it passes is the answer unchanged.
func TestUsageReader(t *testing.T) {
	for _, tc := range []struct {
		name        string
		body        string
		stream      bool
		prompt, out int64
	}{
		{"json", `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`, false, 12, 34},
		{"json, usage first", `{"usage":{"completion_tokens":3,"prompt_tokens":1},"choices":[]}`, false, 1, 3},
		{"stream", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n", true, 5, 7},
		{"stream, CRLF and no space", "data:{\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":9}}\r\n\r\ndata: [DONE]\r\n", true, 2, 9},
		{"stream without usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true, 0, 0},
		{"negative counts", `{"usage":{"prompt_tokens":-5,"completion_tokens":99999999999999}}`, false, 0, 1 << 32},
		{"not JSON", `<html>502</html>`, false, 0, 0},
	} {
		p, c, calls, out := readUsage(t, tc.body, tc.stream)
		if p != tc.prompt || c != tc.out || calls != 1 || string(out) != tc.body {
			t.Errorf("%s: counted %d/%d in %d calls, passed %q", tc.name, p, c, calls, out)
		}
	}
	// An answer larger than what is kept to read its usage passes whole
	// and counts no tokens.
	big := `{"usage":{"prompt_tokens":1,"completion_tokens":1},"pad":"` + strings.Repeat("x", maxUsageScan) + `"}`
	if p, c, calls, out := readUsage(t, big, false); p != 0 || c != 0 || calls != 1 || len(out) != len(big) {
		t.Errorf("a huge answer: %d/%d in %d calls, %d bytes", p, c, calls, len(out))
	}
}

// An engine's answer is a tenant's bytes: the reader never panics, passes
// them unchanged and counts sane numbers.
func FuzzUsageReader(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":34}}`), false)
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n"), true)
	f.Add([]byte("data: {\"usage\":null}\ndata:"), true)
	f.Fuzz(func(t *testing.T, b []byte, stream bool) {
		p, c, calls, out := readUsage(t, string(b), stream)
		if !bytes.Equal(out, b) || calls != 1 || p < 0 || c < 0 || p > 1<<32 || c > 1<<32 {
			t.Fatalf("counted %d/%d in %d calls; passed %d of %d bytes", p, c, calls, len(out), len(b))
		}
	})
}

// What the choose decoder accepts is what serving can take: names the
// endpoint routes by, absolute paths without control characters, shapes
// in range.
func FuzzParseServeChoose(f *testing.F) {
	for _, s := range []string{
		`{"model":{"name":"llama-3","format":"safetensors","weights_bytes":16000000000,"path":"/models/llama","shape":{"layers":32,"hidden":4096,"heads":32,"ffn":14336,"vocab":128256,"seq":8192}}}`,
		`{"model":{"name":"q","format":"gguf","weights_bytes":5,"path":"/m/q.gguf","file":"/m/q.gguf"},"command":["/bin/engine","{port}"],"port":9000,"ready":"/health"}`,
		`{"model":{"name":"../x","format":"gguf","path":"/m"}}`, `{"model":{"name":"x","format":"gguf","path":"rel"}}`,
		`{"model":{"name":"x","format":"onnx","path":"/m"}}`, `{"model":{"name":"x","format":"gguf","path":"/m"},"ready":"/../admin"}`,
		`{"model":{"name":"x","format":"gguf","path":"/m\u001b[31m"}}`, `{}`, `null`,
		`{"model":{"name":"x","format":"gguf","ref":"reg:5000/m@sha256:` + strings.Repeat("a", 64) + `","file":"m.gguf"}}`,
		`{"model":{"name":"x","format":"gguf","ref":"reg:5000/m:v1"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseServeChoose(b)
		if err != nil {
			return
		}
		if r.Model.Ref != "" && (r.Model.Path != "" || !strings.Contains(r.Model.Ref, "@sha256:") || !printableLine(r.Model.Ref)) {
			t.Fatalf("accepted the ref %q", r.Model.Ref)
		}
		if serving.CheckName(r.Model.Name) != nil || (r.Model.Ref == "" && (!strings.HasPrefix(r.Model.Path, "/") || !utf8.ValidString(r.Model.Path) || !printableLine(r.Model.Path))) {
			t.Fatalf("accepted %q", b)
		}
		if r.Ready != "" && (checkReadyPath(r.Ready) != nil || strings.Contains(r.Ready, "..")) {
			t.Fatalf("accepted the readiness path %q", r.Ready)
		}
		if r.Model.WeightsBytes < 0 || r.Context < 0 || r.Batch < 0 || r.GPUs < 0 {
			t.Fatalf("accepted negative sizes: %q", b)
		}
		// servingInput never panics on what was accepted.
		_, _, _ = servingInput(r)
	})
}

// A kept test is the caller's bytes: what the decoder accepts is bounded
// and sane.
func FuzzParseServeTest(f *testing.F) {
	f.Add([]byte(`{"smoke":[{"name":"chat","ok":true,"detail":"hi"}],"load":[{"concurrency":4,"requests":8,"errors":0,"seconds":0.5,"requests_per_s":16,"output_tokens_per_s":96,"ttft_p50_ms":3,"ttft_p99_ms":8,"itl_p50_ms":1,"itl_p99_ms":5,"latency_p50_ms":11,"latency_p99_ms":19}]}`))
	f.Add([]byte(`{"load":[{"concurrency":0}]}`))
	f.Add([]byte(`{"smoke":[{"name":"\u001b[2J","ok":true}]}`))
	f.Add([]byte(`{"load":[{"concurrency":1,"requests":1,"errors":2}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseServeTest(b)
		if err != nil {
			return
		}
		if len(st.Smoke) > maxSmokeChecks || len(st.Load) > maxLoadLevels {
			t.Fatalf("accepted %d checks, %d levels", len(st.Smoke), len(st.Load))
		}
		for _, s := range st.Smoke {
			if !printableLine(s.Name) || !printableLine(s.Detail) || len(s.Detail) > maxTestText {
				t.Fatalf("accepted the check %q", s.Name)
			}
		}
		for _, l := range st.Load {
			if l.Concurrency < 1 || l.Errors > l.Requests || l.Errors < 0 || !finite(l.LatencyP99MS) || l.LatencyP99MS < 0 {
				t.Fatalf("accepted the level %+v", l)
			}
		}
	})
}
