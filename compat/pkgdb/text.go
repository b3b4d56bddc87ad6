package pkgdb

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// cudaVersionJSON reads a CUDA toolkit's version.json (CUDA 11.1 and
// later): an object of components, each {"name": ..., "version": ...}:
//
//	{"cuda": {"name": "CUDA SDK", "version": "12.4.1"},
//	 "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": "12.4.127"}, ...}
//
// The toolkit is the "cuda" entry; see cudaRelease for the runfile's
// "11.8.20220929". ok is false for a valid file without a "cuda" entry.
func cudaVersionJSON(b []byte) (v Version, ok bool, err error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		return Version{}, false, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	raw, found := doc["cuda"]
	if !found {
		return Version{}, false, nil
	}
	var c struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return Version{}, false, fmt.Errorf("%w: \"cuda\" entry: %v", ErrMalformed, err)
	}
	rel, note, good := cudaRelease(strings.TrimSpace(c.Version))
	if !good {
		return Version{}, false, fmt.Errorf("%w: CUDA version %q", ErrMalformed, clip(c.Version))
	}
	return Version{Version: rel, From: note}, true, nil
}

// version.txt, CUDA 11.0 and older: "CUDA Version 10.2.89". Its third
// field is always a build (10.2.89, 10.1.243, 9.0.176: the runtime's
// build, not an update), so only major.minor is kept.
var cudaTxtRe = regexp.MustCompile(`^CUDA Version (\d+)\.(\d+)(?:\.(\d+))?\s*$`)

func cudaVersionTxt(b []byte) (Version, error) {
	line := strings.TrimSpace(string(b))
	if i := strings.IndexAny(line, "\r\n"); i >= 0 {
		line = line[:i]
	}
	m := cudaTxtRe.FindStringSubmatch(line)
	if m == nil {
		return Version{}, fmt.Errorf("%w: %q is not \"CUDA Version X.Y.Z\"", ErrMalformed, clip(line))
	}
	x, err1 := strconv.Atoi(m[1])
	y, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil || len(m[1]) > 2 || len(m[2]) > 2 || !releaseOK([]int{x, y}) {
		return Version{}, fmt.Errorf("%w: CUDA version %q", ErrMalformed, clip(line))
	}
	v := Version{Version: join([]int{x, y})}
	if m[3] != "" {
		v.From = fmt.Sprintf("%s; %s is a build number", line, m[3])
	}
	return v, nil
}

// os-release(5): KEY=VALUE lines, values optionally in single or double
// quotes with backslash escapes; ID is lower-case [a-z0-9._-], VERSION_ID
// [a-zA-Z0-9._~-]. OS is "ID VERSION_ID" ("ubuntu 22.04", "debian 12",
// "alpine 3.20.3"), or ID alone (Debian sid, Arch have no VERSION_ID).
var (
	osIDRe      = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	osVersionRe = regexp.MustCompile(`^[a-zA-Z0-9._~-]{1,64}$`)
)

func parseOSRelease(b []byte) string {
	var id, ver string
	for _, l := range lines(b) {
		l = strings.TrimSpace(l)
		if l == "" || l[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "ID":
			id = strings.ToLower(unquote(v))
		case "VERSION_ID":
			ver = unquote(v)
		}
	}
	if !osIDRe.MatchString(id) {
		return ""
	}
	if !osVersionRe.MatchString(ver) {
		return id
	}
	return id + " " + ver
}

func unquote(v string) string {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		v = v[1 : len(v)-1]
		var sb strings.Builder
		for i := 0; i < len(v); i++ {
			if v[i] == '\\' && i+1 < len(v) {
				i++
			}
			sb.WriteByte(v[i])
		}
		return sb.String()
	}
	return v
}
