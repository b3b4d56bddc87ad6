package unwrap

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
)

// CloseJSON mends a JSON document whose tail was cut off (a capture copied
// from a scrolled terminal, a log collector's line limit): it keeps every
// complete member and element and closes the objects and arrays left open.
// When only closing brackets are missing every member is kept; otherwise
// the member the cut went through is dropped. Several documents one after
// the other (amd-smi prints one per command) are kept, the last one mended;
// text after the last complete document that is no JSON is dropped. ok is
// false when data needed no mending or holds no JSON container.
func CloseJSON(data []byte) ([]byte, bool) {
	start := bytes.IndexAny(data, "{[")
	if start < 0 {
		return nil, false
	}
	t := bytes.TrimRight(data, " \t\r\n")
	var stack, cutStack []byte
	cutAt, docEnd := -1, -1
	inStr, esc := false, false
	for i := start; i < len(t); i++ {
		c := t[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			stack = append(stack, c)
		case '}', ']':
			if len(stack) == 0 {
				// A closer with nothing open: what follows is no JSON.
				if docEnd > 0 {
					return data[:docEnd], true
				}
				return nil, false
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				docEnd = i + 1
			}
			cutAt, cutStack = i+1, append(cutStack[:0], stack...)
		case ',':
			cutAt, cutStack = i, append(cutStack[:0], stack...)
		}
	}
	if len(stack) == 0 && !inStr {
		if docEnd == len(t) || validStream(data[start:]) {
			return nil, false // whole already
		}
		if docEnd > 0 {
			return data[:docEnd], true // text after the last document
		}
		return nil, false
	}
	// Cut right after a complete value: only the brackets are missing.
	if !inStr && len(stack) <= 1024 {
		if out := appendClosers(append([]byte(nil), t...), stack); validStream(out[start:]) {
			return out, true
		}
	}
	if cutAt < 0 {
		// Nothing complete inside the first container: keep it empty.
		cutAt, cutStack = start+1, stack[:1]
	}
	return appendClosers(append([]byte(nil), t[:cutAt]...), cutStack), true
}

func appendClosers(out, stack []byte) []byte {
	for i := len(stack) - 1; i >= 0; i-- {
		if stack[i] == '{' {
			out = append(out, '}')
		} else {
			out = append(out, ']')
		}
	}
	return out
}

// validStream: data is one or more whole JSON values one after the other.
func validStream(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return errors.Is(err, io.EOF) && n > 0
		}
		n++
	}
}

// CloseXML mends an XML document whose tail was cut off: it keeps every
// complete token and closes the elements left open. ok is false when data
// needed no mending or is not XML up to the cut.
func CloseXML(data []byte) ([]byte, bool) {
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = false
	d.Entity = xml.HTMLEntity
	var stack []string
	good := int64(0)
	var goodStack []string
	for {
		tok, err := d.RawToken()
		if errors.Is(err, io.EOF) && len(stack) == 0 {
			return nil, false
		}
		if err != nil {
			break
		}
		switch t := tok.(type) {
		case xml.StartElement:
			stack = append(stack, t.Name.Local)
		case xml.EndElement:
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			if len(stack) == 0 {
				return nil, false
			}
		case xml.CharData:
			// Text counts only once its element closes: a value cut in
			// the middle ("<max_link_width>1" of 16) must not be read.
			continue
		}
		good = d.InputOffset()
		goodStack = append(goodStack[:0], stack...)
	}
	if len(goodStack) == 0 {
		return nil, false
	}
	out := append([]byte(nil), data[:good]...)
	for i := len(goodStack) - 1; i >= 0; i-- {
		out = append(out, "</"+goodStack[i]+">"...)
	}
	return out, true
}
