package unwrap

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
)

// CloseJSON mends a JSON document whose tail was cut off (a capture copied
// from a scrolled terminal, a log collector's line limit): it keeps every
// complete member and element and closes the objects and arrays left open.
// ok is false when data needed no mending or holds no JSON container.
// Text after a complete document is dropped.
func CloseJSON(data []byte) ([]byte, bool) {
	start := bytes.IndexAny(data, "{[")
	if start < 0 {
		return nil, false
	}
	var stack, cutStack []byte
	cutAt := -1
	inStr, esc := false, false
	for i := start; i < len(data); i++ {
		c := data[i]
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
				return nil, false
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				// A complete document: whatever follows is not part of it.
				if i+1 == len(bytes.TrimRight(data, " \t\r\n")) {
					return nil, false
				}
				return data[:i+1], true
			}
			cutAt, cutStack = i+1, append(cutStack[:0], stack...)
		case ',':
			cutAt, cutStack = i, append(cutStack[:0], stack...)
		}
	}
	if len(stack) == 0 {
		return nil, false
	}
	if cutAt < 0 {
		// Nothing complete inside the first container: keep it empty.
		cutAt, cutStack = start+1, stack[:1]
	}
	out := append([]byte(nil), data[:cutAt]...)
	for i := len(cutStack) - 1; i >= 0; i-- {
		if cutStack[i] == '{' {
			out = append(out, '}')
		} else {
			out = append(out, ']')
		}
	}
	return out, true
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
