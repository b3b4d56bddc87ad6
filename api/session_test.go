package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var b bytes.Buffer
	fw := NewFrameWriter(&b)
	big := bytes.Repeat([]byte("x"), MaxFrame+10)
	if err := fw.WriteJSON(FrameOpen, SessionRequest{Command: []string{"ls", "-l"}, TTY: true, Rows: 3, Cols: 4}); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteData(FrameStdin, big); err != nil {
		t.Fatal(err)
	}
	if err := fw.Write(FrameResize, ResizePayload(50, 132)); err != nil {
		t.Fatal(err)
	}
	if err := fw.Write(FrameEOF, nil); err != nil {
		t.Fatal(err)
	}
	if err := fw.Write(FrameStdin, big); err == nil {
		t.Error("a frame above MaxFrame was written")
	}
	br := bufio.NewReader(&b)
	buf := make([]byte, MaxFrame)
	var kinds []byte
	var data int
	for {
		k, p, err := ReadFrame(br, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
		switch k {
		case FrameOpen:
			var r SessionRequest
			if err := json.Unmarshal(p, &r); err != nil || r.Rows != 3 || len(r.Command) != 2 {
				t.Errorf("open frame %s: %v", p, err)
			}
		case FrameStdin:
			data += len(p)
		case FrameResize:
			if r, c, err := ParseResize(p); err != nil || r != 50 || c != 132 {
				t.Errorf("resize %d %d %v", r, c, err)
			}
		}
	}
	if string(kinds) != "Oiirc" || data != len(big) {
		t.Errorf("frames %q, %d input bytes", kinds, data)
	}
}

func TestReadFrameRefuses(t *testing.T) {
	buf := make([]byte, MaxFrame)
	huge := []byte{FrameStdout, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := ReadFrame(bufio.NewReader(bytes.NewReader(huge)), buf); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("a 4 GiB frame: %v", err)
	}
	cut := []byte{FrameStdout, 0, 0, 0, 9, 'a'}
	if _, _, err := ReadFrame(bufio.NewReader(bytes.NewReader(cut)), buf); err != io.ErrUnexpectedEOF {
		t.Errorf("a frame cut short: %v", err)
	}
	if _, _, err := ParseResize([]byte{1, 2, 3}); err == nil {
		t.Error("a short resize was read")
	}
}

func TestSessionRequestCheck(t *testing.T) {
	long := make([]string, MaxSessionArgs+1)
	for i := range long {
		long[i] = "a"
	}
	for _, c := range []struct {
		r    SessionRequest
		want string
	}{
		{SessionRequest{}, ""},
		{SessionRequest{Command: []string{"bash"}, TTY: true, Rows: 24, Cols: 80, Term: "xterm-256color"}, ""},
		{SessionRequest{Command: long}, "arguments"},
		{SessionRequest{Command: []string{strings.Repeat("a", MaxSessionBytes+1)}}, "bytes long"},
		{SessionRequest{Command: []string{"a\x00b"}}, "not text"},
		{SessionRequest{Command: []string{"\xff"}}, "not text"},
		{SessionRequest{Command: []string{""}}, "empty"},
		{SessionRequest{Rows: 3}, "without a terminal"},
		{SessionRequest{TTY: true, Term: "xterm; rm -rf /"}, "TERM"},
		{SessionRequest{TTY: true, Term: strings.Repeat("x", 65)}, "TERM"},
	} {
		err := c.r.Check()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.r, err, c.want)
		}
	}
}

// FuzzReadFrame: any bytes give frames within bounds or an error, never a
// panic; a request read from them either passes Check or is refused.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	fw := NewFrameWriter(&b)
	fw.WriteJSON(FrameOpen, SessionRequest{Command: []string{"sh", "-c", "id"}, TTY: true, Rows: 1, Cols: 2})
	fw.Write(FrameResize, ResizePayload(1, 2))
	f.Add(b.Bytes())
	f.Add([]byte{FrameOpen, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{FrameStdin, 0xff, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReader(bytes.NewReader(data))
		buf := make([]byte, MaxFrame)
		for {
			k, p, err := ReadFrame(br, buf)
			if err != nil {
				return
			}
			if len(p) > MaxFrame {
				t.Fatalf("a frame of %d bytes", len(p))
			}
			switch k {
			case FrameOpen:
				var r SessionRequest
				if json.Unmarshal(p, &r) == nil && r.Check() == nil {
					if len(r.Command) > MaxSessionArgs || (len(r.Command) > 0 && r.Command[0] == "") {
						t.Fatalf("Check passed %+v", r)
					}
				}
			case FrameResize:
				_, _, _ = ParseResize(p)
			}
		}
	})
}
