package pkgdb

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// rpm's sqlite backend (rpm >= 4.16; RHEL 9, UBI 9, Fedora 33+) keeps one
// row per installed package in Packages(hnum INTEGER PRIMARY KEY, blob
// BLOB); blob is the package's header as rpm exports it (headerExport in
// rpm's lib/header.c), without the 8-byte header magic:
//
//	il  uint32 BE   number of index entries
//	dl  uint32 BE   size of the data store
//	il × {tag, type, offset, count int32 BE}
//	dl bytes of data; a STRING (type 6) is NUL-terminated at offset,
//	an INT32 (type 4) is 4 BE bytes at offset.
//
// The first entry is usually the immutable region tag (63). Older images
// (CentOS 7, RHEL/UBI 8) use the Berkeley DB "Packages" file, which this
// package does not read.
const (
	rpmTagName    = 1000
	rpmTagVersion = 1001
	rpmTagRelease = 1002
	rpmTagEpoch   = 1003

	rpmTypeInt32       = 4
	rpmTypeString      = 6
	rpmTypeStringArray = 8
	rpmTypeI18NString  = 9

	// rpm's own sanity limits (hdrchkTags, hdrchkData in lib/header.c).
	rpmMaxTags = 0xffff
	rpmMaxData = 0x0fffffff

	// rpmMaxRows bounds the rows read from one database.
	rpmMaxRows = 1 << 20
)

var rpmMagic = []byte{0x8e, 0xad, 0xe8, 0x01}

// parseRPMHeader reads NAME, VERSION, RELEASE and EPOCH from one header
// blob. Version is "VERSION-RELEASE", with "EPOCH:" before it when the
// header has a non-zero epoch (as dpkg writes epochs).
func parseRPMHeader(b []byte) (Package, error) {
	if len(b) >= 8 && string(b[:4]) == string(rpmMagic) {
		b = b[8:] // magic + 4 reserved bytes, as in an rpm file's header
	}
	if len(b) < 8 {
		return Package{}, fmt.Errorf("%w: rpm header of %d bytes", ErrMalformed, len(b))
	}
	il := binary.BigEndian.Uint32(b[0:4])
	dl := binary.BigEndian.Uint32(b[4:8])
	if il == 0 || il > rpmMaxTags || dl > rpmMaxData {
		return Package{}, fmt.Errorf("%w: rpm header with %d entries, %d data bytes", ErrMalformed, il, dl)
	}
	need := 8 + uint64(il)*16 + uint64(dl)
	if uint64(len(b)) < need {
		return Package{}, fmt.Errorf("%w: rpm header needs %d bytes, has %d", ErrMalformed, need, len(b))
	}
	index := b[8 : 8+int(il)*16]
	data := b[8+int(il)*16 : need]
	var name, version, release string
	epoch, hasEpoch := uint32(0), false
	for i := 0; i < int(il); i++ {
		e := index[i*16 : i*16+16]
		tag := binary.BigEndian.Uint32(e[0:4])
		typ := binary.BigEndian.Uint32(e[4:8])
		off := binary.BigEndian.Uint32(e[8:12])
		cnt := binary.BigEndian.Uint32(e[12:16])
		switch tag {
		case rpmTagName, rpmTagVersion, rpmTagRelease:
			if typ != rpmTypeString && typ != rpmTypeStringArray && typ != rpmTypeI18NString || cnt < 1 {
				return Package{}, fmt.Errorf("%w: rpm tag %d of type %d", ErrMalformed, tag, typ)
			}
			s, ok := rpmString(data, off)
			if !ok {
				return Package{}, fmt.Errorf("%w: rpm tag %d string out of bounds", ErrMalformed, tag)
			}
			switch tag {
			case rpmTagName:
				name = s
			case rpmTagVersion:
				version = s
			case rpmTagRelease:
				release = s
			}
		case rpmTagEpoch:
			if typ != rpmTypeInt32 || cnt < 1 || uint64(off)+4 > uint64(len(data)) {
				return Package{}, fmt.Errorf("%w: rpm epoch entry", ErrMalformed)
			}
			epoch, hasEpoch = binary.BigEndian.Uint32(data[off:off+4]), true
		}
	}
	if name == "" || version == "" {
		return Package{}, fmt.Errorf("%w: rpm header without name or version", ErrMalformed)
	}
	v := version
	if release != "" {
		v += "-" + release
	}
	if hasEpoch && epoch != 0 {
		v = strconv.FormatUint(uint64(epoch), 10) + ":" + v
	}
	return Package{Name: name, Version: v, Source: SourceRPM}, nil
}

func rpmString(data []byte, off uint32) (string, bool) {
	if uint64(off) >= uint64(len(data)) {
		return "", false
	}
	rest := data[off:]
	for i, c := range rest {
		if c == 0 {
			return string(rest[:i]), true
		}
	}
	return "", false
}

// readRPMDB copies at most limit bytes of body to a temporary file, opens
// it read-only with SQLite and reads every header of its Packages table.
// The file is removed before it returns. Rows whose header does not parse
// are skipped; a database none of whose rows parse is malformed.
func readRPMDB(body io.Reader, limit int64) ([]Package, error) {
	dir, err := os.MkdirTemp("", "kiln-rpmdb-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "rpmdb.sqlite")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(f, io.LimitReader(body, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("%w: rpmdb.sqlite is over %d bytes", ErrTooLarge, limit)
	}
	if n < 100 || !isSQLite(p) {
		return nil, fmt.Errorf("%w: not an SQLite database", ErrMalformed)
	}
	// immutable=1: the copy is read once and never written; SQLite takes
	// no locks and leaves no -wal or -shm files (a WAL database's
	// committed pages are in the main file once rpm has checkpointed it,
	// which it does when it closes the database).
	db, err := sql.Open("sqlite", "file:"+sqliteURIPath(p)+"?mode=ro&immutable=1")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT blob FROM Packages ORDER BY hnum")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	defer rows.Close()
	var out []Package
	seen, bad := 0, 0
	for rows.Next() {
		if seen++; seen > rpmMaxRows {
			return nil, fmt.Errorf("%w: over %d packages", ErrTooLarge, rpmMaxRows)
		}
		var blob []byte
		if err := rows.Scan(&blob); err != nil {
			bad++
			continue
		}
		pk, err := parseRPMHeader(blob)
		if err != nil {
			bad++
			continue
		}
		out = append(out, pk)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(out) == 0 && bad > 0 {
		return nil, fmt.Errorf("%w: none of %d rpm headers parse", ErrMalformed, bad)
	}
	return out, nil
}

// isSQLite checks the 16-byte header string of an SQLite 3 file.
func isSQLite(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var h [16]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return false
	}
	return string(h[:]) == "SQLite format 3\x00"
}

// sqliteURIPath escapes the characters an SQLite URI filename gives a
// meaning to.
func sqliteURIPath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(p))
}
