package pkgdb

import "strings"

// lines splits b into lines without their "\n" or "\r\n" ends.
func lines(b []byte) []string {
	s := string(b)
	out := strings.Split(s, "\n")
	for i, l := range out {
		out[i] = strings.TrimSuffix(l, "\r")
	}
	return out
}

// parseDpkg reads dpkg's database: var/lib/dpkg/status, or one file of a
// distroless var/lib/dpkg/status.d/.
//
// Format (deb-control(5), Debian Policy 5.1): paragraphs of "Field: value"
// lines separated by blank lines (a line of only spaces and tabs counts
// as blank); a line starting with a space or tab continues the field
// above (Description's long text, Conffiles), so "Package:" inside it is
// not a field. Field names are case-insensitive.
//
// Status (dpkg(1), "Status: want flag state"): a package's files are on
// disk when its state is "installed", or "triggers-awaited" /
// "triggers-pending" (configured, waiting for a trigger) and its flag is
// "ok". The want word is not looked at: nvidia/cuda images
// "apt-mark hold" libcublas and cuDNN, which makes them
// "hold ok installed", and those are installed. "deinstall ok
// config-files", "install ok half-installed", "install ok unpacked" are
// not. Distroless status.d stanzas have no Status line (they are written
// for installed packages only), so needStatus is false for them.
func parseDpkg(b []byte, needStatus bool) []Package {
	var out []Package
	var name, version, status string
	hasStatus := false
	inPara := false
	flush := func() {
		if inPara && name != "" && version != "" && (hasStatus && dpkgInstalled(status) || !hasStatus && !needStatus) {
			out = append(out, Package{Name: name, Version: version, Source: SourceDpkg})
		}
		name, version, status, hasStatus, inPara = "", "", "", false, false
	}
	for _, l := range lines(b) {
		if strings.TrimLeft(l, " \t") == "" {
			flush()
			continue
		}
		inPara = true
		if l[0] == ' ' || l[0] == '\t' {
			continue // continuation of field
		}
		if l[0] == '#' {
			continue // comment (deb822); not written by dpkg
		}
		i := strings.IndexByte(l, ':')
		if i <= 0 {
			continue
		}
		v := strings.TrimSpace(l[i+1:])
		switch strings.ToLower(l[:i]) {
		case "package":
			name = v
		case "version":
			version = v
		case "status":
			status, hasStatus = v, true
		}
	}
	flush()
	return out
}

func dpkgInstalled(status string) bool {
	f := strings.Fields(status)
	if len(f) != 3 || f[1] != "ok" {
		return false
	}
	switch f[2] {
	case "installed", "triggers-awaited", "triggers-pending":
		return true
	}
	return false
}

// parseApk reads apk-tools' database, lib/apk/db/installed: one package
// per paragraph, blank lines between them, each line "K:value" with a
// one-letter key; P is the name, V the version ("1.2.5-r0"), other keys
// (C checksum, A arch, F directory, R file, ...) are not needed here.
func parseApk(b []byte) []Package {
	var out []Package
	var name, version string
	flush := func() {
		if name != "" && version != "" {
			out = append(out, Package{Name: name, Version: version, Source: SourceApk})
		}
		name, version = "", ""
	}
	for _, l := range lines(b) {
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		if len(l) < 2 || l[1] != ':' {
			continue
		}
		v := strings.TrimSpace(l[2:])
		switch l[0] {
		case 'P':
			if name != "" {
				flush() // a package without the blank line before it
			}
			name = v
		case 'V':
			version = v
		}
	}
	flush()
	return out
}
