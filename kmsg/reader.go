package kmsg

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Reader streams events out of a kernel log. An event is returned once the
// line after it shows that no more detail lines follow (or at the end of the
// input), so multi-line reports come out whole.
type Reader struct {
	br     *bufio.Reader
	lines  int
	format string
	pend   *record // record whose continuation lines may still follow
	b      builder
	facts  factSet
	out    []snapshot.Event
	done   bool
	err    error
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader {
	rd := &Reader{br: bufio.NewReaderSize(r, 64<<10)}
	rd.b.lastIndex = -1
	return rd
}

// Next returns the next event, or io.EOF after the last one. A read error
// is returned after the events read before it.
func (r *Reader) Next() (snapshot.Event, error) {
	for len(r.out) == 0 {
		if r.done {
			if r.err != nil {
				return snapshot.Event{}, r.err
			}
			return snapshot.Event{}, io.EOF
		}
		line, err := r.readLine()
		if line != "" || err == nil {
			r.feed(line)
		}
		if err != nil {
			if r.pend != nil {
				r.handle(r.pend)
				r.pend = nil
			}
			r.b.close(&r.out)
			r.done = true
			if !errors.Is(err, io.EOF) {
				r.err = fmt.Errorf("reading kernel log after line %d: %w", r.lines, err)
			}
		}
	}
	ev := r.out[0]
	r.out[0] = snapshot.Event{}
	r.out = r.out[1:]
	return ev, nil
}

// readLine returns the next line without its end of line, cut to MaxLine
// bytes and made valid UTF-8.
func (r *Reader) readLine() (string, error) {
	var buf []byte
	for {
		frag, err := r.br.ReadSlice('\n')
		if len(buf) < MaxLine {
			buf = append(buf, frag[:min(len(frag), MaxLine-len(buf))]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == nil || len(buf) > 0 {
			r.lines++
		}
		line := strings.TrimRight(string(buf), "\r\n")
		return strings.ToValidUTF8(line, "\uFFFD"), err
	}
}

func (r *Reader) feed(line string) {
	prevKmsg := r.pend != nil && r.pend.source == "kmsg"
	kind, rec := parseLine(line, prevKmsg)
	switch kind {
	case lineSkip:
		return
	case lineDict:
		if m := reKmsgDict().FindStringSubmatch(line); m != nil && m[1] == "DEVICE" && r.pend != nil {
			if a, ok := strings.CutPrefix(m[2], "+pci:"); ok {
				if c, err := snapshot.CanonicalPCI(a); err == nil {
					r.pend.device = c
				}
			}
		}
		return
	case lineCont:
		if r.pend != nil {
			r.pend.addMore(line)
			return
		}
		rec = record{source: "dmesg", kernel: true, text: strings.TrimSpace(line)}
	}
	if r.pend != nil {
		r.handle(r.pend)
	}
	if r.format == "" && rec.format != "" {
		r.format = rec.format
	}
	r.pend = &rec
}

func (r *Reader) handle(rec *record) {
	if !rec.kernel {
		r.b.close(&r.out)
		return
	}
	text := rec.joined()
	r.facts.observe(text)
	r.b.process(rec, text, &r.out)
}
