package pkgdb

import (
	"database/sql"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// firstBlob is the header blob of the first row of testdata's rpmdb.
func firstBlob(t testing.TB) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rpmdb.sqlite")
	if err := os.WriteFile(p, rpmDB(t), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+p+"?mode=ro&immutable=1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var b []byte
	if err := db.QueryRow("SELECT blob FROM Packages ORDER BY hnum LIMIT 1").Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// synthHeader builds an rpm header blob (no magic) with one entry per
// tag: a string value is a STRING, a uint32 an INT32.
func synthHeader(tags map[uint32]any) []byte {
	keys := make([]uint32, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	var index, data []byte
	for _, k := range keys {
		var typ uint32
		switch v := tags[k].(type) {
		case string:
			typ = rpmTypeString
			index = binary.BigEndian.AppendUint32(index, k)
			index = binary.BigEndian.AppendUint32(index, typ)
			index = binary.BigEndian.AppendUint32(index, uint32(len(data)))
			index = binary.BigEndian.AppendUint32(index, 1)
			data = append(append(data, v...), 0)
		case uint32:
			typ = rpmTypeInt32
			for len(data)%4 != 0 {
				data = append(data, 0)
			}
			index = binary.BigEndian.AppendUint32(index, k)
			index = binary.BigEndian.AppendUint32(index, typ)
			index = binary.BigEndian.AppendUint32(index, uint32(len(data)))
			index = binary.BigEndian.AppendUint32(index, 1)
			data = binary.BigEndian.AppendUint32(data, v)
		}
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(keys)))
	out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
	return append(append(out, index...), data...)
}

// corruptOffset sets the data offset of index entry i.
func corruptOffset(b []byte, i int, off uint32) []byte {
	b = append([]byte(nil), b...)
	binary.BigEndian.PutUint32(b[8+i*16+8:], off)
	return b
}

// unterminated replaces every NUL of the data store, so no string ends.
func unterminated(b []byte) []byte {
	b = append([]byte(nil), b...)
	il := int(binary.BigEndian.Uint32(b[0:4]))
	for i := 8 + il*16; i < len(b); i++ {
		if b[i] == 0 {
			b[i] = 'a'
		}
	}
	return b
}
