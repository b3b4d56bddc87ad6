package api

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"kiln.dev/kiln/textsafe"
)

// A session runs a command beside a lease's job on its node (kiln exec,
// kiln shell): the same user, environment, file system view and limits as
// the job, on a terminal of its own when asked. Its bytes travel as frames
// over a tunnel (POST /v1/leases/{id}/sessions): a kind byte, the
// payload's length (4 bytes, big-endian) and the payload. The user's side
// sends FrameOpen first, then input, resizes, signals; the node's side
// sends output and, last, FrameExit or FrameError.
const (
	FrameOpen   byte = 'O' // user: the SessionRequest, as JSON (first frame only)
	FrameStdin  byte = 'i' // user: bytes for the command's input
	FrameEOF    byte = 'c' // user: the input ends (no payload)
	FrameResize byte = 'r' // user: the terminal's size: rows, columns (2 bytes each)
	FrameSignal byte = 's' // user: a signal's name (INT, TERM, HUP, QUIT) for the command's group
	FrameStdout byte = 'o' // node: the command's output (its terminal's, with TTY)
	FrameStderr byte = 'e' // node: the command's error output (without TTY)
	FrameExit   byte = 'x' // node: how it ended, SessionExit as JSON; the last frame
	FrameError  byte = '!' // node or server: why there is no session, as text; the last frame
)

// MaxFrame bounds a frame's payload.
const MaxFrame = 64 << 10

// Session request bounds: what the server accepts and sends on to the node.
const (
	MaxSessionArgs  = 256
	MaxSessionBytes = 8 << 10 // all arguments together
)

// SessionRequest is what a session runs: Command beside the job (empty:
// the job's user's shell), on a terminal of Rows x Cols when TTY.
type SessionRequest struct {
	Command []string `json:"command,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	// Term is the user's terminal type (TERM), given to the command with
	// TTY.
	Term string `json:"term,omitempty"`
}

// Check says what is wrong with a session request.
func (r SessionRequest) Check() error {
	if len(r.Command) > MaxSessionArgs {
		return fmt.Errorf("the command has %d arguments; at most %d", len(r.Command), MaxSessionArgs)
	}
	total := 0
	for i, a := range r.Command {
		total += len(a)
		if strings.IndexByte(a, 0) >= 0 || !utf8.ValidString(a) {
			return fmt.Errorf("argument %d of the command is not text (a NUL byte or invalid UTF-8)", i+1)
		}
	}
	if total > MaxSessionBytes {
		return fmt.Errorf("the command is %d bytes long; at most %d", total, MaxSessionBytes)
	}
	if len(r.Command) > 0 && r.Command[0] == "" {
		return errors.New("the command's program is empty")
	}
	if !r.TTY && (r.Rows != 0 || r.Cols != 0 || r.Term != "") {
		return errors.New("a terminal size or type without a terminal (tty)")
	}
	if len(r.Term) > 64 || strings.Trim(r.Term, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_+") != "" {
		return fmt.Errorf("terminal type %q: want a TERM name (letters, digits, . - _ +)", r.Term)
	}
	return nil
}

// SessionExit is how a session's command ended.
type SessionExit struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	// Reason says why kiln ended it, when it did (the job ended, the
	// lease ended, the server stops).
	Reason string `json:"reason,omitempty"`
}

// FrameWriter writes frames; it is safe for concurrent use.
type FrameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewFrameWriter writes frames to w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// Write sends one frame of kind with payload p (at most MaxFrame bytes;
// longer output is split by WriteData).
func (f *FrameWriter) Write(kind byte, p []byte) error {
	if len(p) > MaxFrame {
		return fmt.Errorf("frame of %d bytes: at most %d", len(p), MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	f.mu.Lock()
	defer f.mu.Unlock()
	// One write per frame: the stream below flushes each.
	buf := make([]byte, 0, 5+len(p))
	buf = append(append(buf, hdr[:]...), p...)
	_, err := f.w.Write(buf)
	return err
}

// WriteData sends p as frames of kind, split at MaxFrame.
func (f *FrameWriter) WriteData(kind byte, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxFrame)
		if err := f.Write(kind, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// WriteJSON sends v as the JSON payload of a frame of kind.
func (f *FrameWriter) WriteJSON(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return f.Write(kind, b)
}

// ErrFrameTooLarge is a frame whose length is above MaxFrame.
var ErrFrameTooLarge = errors.New("a session frame is larger than allowed")

// ReadFrame reads one frame; its payload is valid until the next call
// with the same buf, which must hold MaxFrame bytes. A stream that ends
// between frames gives io.EOF; inside one, io.ErrUnexpectedEOF.
func ReadFrame(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w (%d bytes, kind %q)", ErrFrameTooLarge, n, hdr[0])
	}
	if len(buf) < int(n) {
		return 0, nil, fmt.Errorf("frame buffer of %d bytes: want %d", len(buf), MaxFrame)
	}
	p := buf[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], p, nil
}

// ResizePayload is a FrameResize payload.
func ResizePayload(rows, cols uint16) []byte {
	var b [4]byte
	binary.BigEndian.PutUint16(b[:2], rows)
	binary.BigEndian.PutUint16(b[2:], cols)
	return b[:]
}

// ParseResize reads a FrameResize payload.
func ParseResize(p []byte) (rows, cols uint16, err error) {
	if len(p) != 4 {
		return 0, 0, fmt.Errorf("a resize frame of %d bytes: want 4", len(p))
	}
	return binary.BigEndian.Uint16(p[:2]), binary.BigEndian.Uint16(p[2:]), nil
}

// SessionSignals are the signals a user may send a session's command.
var SessionSignals = []string{"INT", "TERM", "HUP", "QUIT"}

// SessionIO is what a session is connected to on the user's side.
type SessionIO struct {
	// Stdin is sent as its input; nil sends none (its input ends at once).
	Stdin io.Reader
	// Stdout and Stderr take its output (with TTY, all of it is Stdout).
	Stdout, Stderr io.Writer
	// Resize and Signal, when not nil, carry the terminal's new sizes
	// (rows, columns) and signals to send (SessionSignals).
	Resize <-chan [2]uint16
	Signal <-chan string
}

// ErrSessionCut is a session whose stream ended before it said how its
// command ended.
var ErrSessionCut = errors.New("the session's stream ended before its command did (the lease ended, the node or the server went away)")

// RunSession carries a session opened with OpenSession until its command
// ends, and returns how it ended. It closes st.
func RunSession(ctx context.Context, st *Stream, fw *FrameWriter, sio SessionIO) (SessionExit, error) {
	defer st.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
			st.Close()
		case <-stop:
		}
	}()
	go func() {
		if sio.Stdin == nil {
			_ = fw.Write(FrameEOF, nil)
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := sio.Stdin.Read(buf)
			if n > 0 && fw.Write(FrameStdin, buf[:n]) != nil {
				return
			}
			if err != nil {
				_ = fw.Write(FrameEOF, nil)
				return
			}
		}
	}()
	if sio.Resize != nil || sio.Signal != nil {
		go func() {
			for {
				select {
				case sz := <-sio.Resize:
					_ = fw.Write(FrameResize, ResizePayload(sz[0], sz[1]))
				case sig := <-sio.Signal:
					_ = fw.Write(FrameSignal, []byte(sig))
				case <-stop:
					return
				}
			}
		}()
	}
	br := bufio.NewReaderSize(st, 64<<10)
	buf := make([]byte, MaxFrame)
	for {
		kind, p, err := ReadFrame(br, buf)
		if err != nil {
			if ctx.Err() != nil {
				return SessionExit{}, ctx.Err()
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, ErrFrameTooLarge) {
				// The stream was cut (ended, or reset) between frames
				// or inside one.
				return SessionExit{}, fmt.Errorf("%w: %v", ErrSessionCut, err)
			}
			return SessionExit{}, fmt.Errorf("the session's stream: %w", err)
		}
		switch kind {
		case FrameStdout, FrameStderr:
			w := sio.Stdout
			if kind == FrameStderr && sio.Stderr != nil {
				w = sio.Stderr
			}
			if w != nil {
				if _, err := w.Write(p); err != nil {
					return SessionExit{}, fmt.Errorf("writing the session's output: %w", err)
				}
			}
		case FrameExit:
			var ex SessionExit
			if err := json.Unmarshal(p, &ex); err != nil {
				return SessionExit{}, fmt.Errorf("the session's exit frame: %w", err)
			}
			return ex, nil
		case FrameError:
			return SessionExit{}, fmt.Errorf("session: %s", textsafe.Printable(string(p)))
		default:
			return SessionExit{}, fmt.Errorf("a session frame of kind %q from the node", kind)
		}
	}
}
