package server

import (
	"bytes"
	"testing"

	"kiln.dev/kiln/api"
)

// TestExitTapAcrossChunks: the exit is found however the stream is cut
// into reads.
func TestExitTapAcrossChunks(t *testing.T) {
	var b bytes.Buffer
	fw := api.NewFrameWriter(&b)
	fw.WriteData(api.FrameStdout, bytes.Repeat([]byte("o"), 70000))
	fw.Write(api.FrameStderr, nil)
	fw.WriteJSON(api.FrameExit, api.SessionExit{Code: 130, Signal: "interrupt", Reason: "the job ended"})
	for _, chunk := range []int{1, 3, 5, 7, 4096, 1 << 20} {
		tap := &exitTap{}
		p := b.Bytes()
		for len(p) > 0 {
			n := min(chunk, len(p))
			tap.write(p[:n])
			p = p[n:]
		}
		if tap.exit == nil || tap.exit.Code != 130 || exitText(*tap.exit) != "killed by interrupt (the job ended)" {
			t.Errorf("chunks of %d: %+v", chunk, tap.exit)
		}
	}
	tap := &exitTap{}
	tap.write([]byte{api.FrameError, 0, 0, 0, 3, 'b', 'a', 'd'})
	if tap.err != "bad" || tap.exit != nil {
		tap.err = "?"
		t.Errorf("error frame: %q", tap.err)
	}
}

func FuzzExitTap(f *testing.F) {
	var b bytes.Buffer
	api.NewFrameWriter(&b).WriteJSON(api.FrameExit, api.SessionExit{Code: 1})
	f.Add(b.Bytes(), 3)
	f.Add([]byte{api.FrameStdout, 0xff, 0xff, 0xff, 0xff, 1}, 1)
	f.Fuzz(func(t *testing.T, data []byte, chunk int) {
		if chunk <= 0 {
			chunk = 1
		}
		tap := &exitTap{}
		for len(data) > 0 {
			n := min(chunk, len(data))
			tap.write(data[:n])
			data = data[n:]
		}
		if len(tap.payload) > api.MaxFrame || len(tap.err) > 400 {
			t.Fatalf("kept %d bytes", len(tap.payload))
		}
		if tap.exit != nil {
			_ = exitText(*tap.exit)
		}
	})
}
