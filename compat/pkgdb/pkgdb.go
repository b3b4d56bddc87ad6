// Package pkgdb reads the CUDA and ROCm versions an image holds from the
// places package managers and toolkit installers record them: the dpkg,
// apk and rpm databases, CUDA's version.json / version.txt, ROCm's
// .info/version files, and os-release.
//
// It parses the bytes it is given, but for rpm's SQLite backend, which it
// copies to a temporary file to open with SQLite (so it is not one of the
// analysis packages that do no I/O; docs/architecture.md). A version
// kiln reports is a release number ("12.4.1", "6.2.0", "5.2"), never a
// build id: fields that look like build numbers (HIP's 41133, CUDA's
// 20220929 or 89, a minor of 100 or more) are dropped or rejected, and
// each Version says where it was read and why it was read that way.
package pkgdb

import (
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
)

// Package is one installed package.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Source is the database it was read from: "dpkg", "apk" or "rpm".
	Source string `json:"source"`
}

// Version is one version fact and where it comes from.
type Version struct {
	// Version is a release: "12.4.1", "12.4", "6.2.0", "5.2".
	Version string `json:"version"`
	// From names the file or package it was read from and, where the
	// value was derived, how: "usr/local/cuda-12.4/version.json",
	// "dpkg: cuda-cudart-12-4 12.4.127-1 (...)".
	From string `json:"from"`
}

// Facts are what one file (or, merged, several) says.
type Facts struct {
	Packages []Package `json:"packages,omitempty"`
	// CUDA are the CUDA toolkit/runtime versions found, best first.
	CUDA []Version `json:"cuda,omitempty"`
	// ROCm are the ROCm releases found, best first.
	ROCm []Version `json:"rocm,omitempty"`
	// CompatDriver are the driver versions of CUDA forward-compatibility
	// packages (cuda-compat-X-Y): a user-space libcuda newer than the
	// node's driver, not a toolkit.
	CompatDriver []Version `json:"compat_driver,omitempty"`
	// OS is "ID VERSION_ID" from os-release: "ubuntu 22.04".
	OS string `json:"os,omitempty"`
}

// Sources of packages.
const (
	SourceDpkg = "dpkg"
	SourceApk  = "apk"
	SourceRPM  = "rpm"
)

var (
	// ErrTooLarge is returned when a body is larger than MaxBytes.
	ErrTooLarge = errors.New("pkgdb: file too large")
	// ErrMalformed is returned (wrapped) when a file's content is not
	// what its path says it is.
	ErrMalformed = errors.New("pkgdb: malformed file")
	// ErrNotWanted is returned by Read for a path Wants rejects.
	ErrNotWanted = errors.New("pkgdb: not a file pkgdb reads")
)

// Body size limits.
const (
	maxPackageDB = 16 << 20 // dpkg status, apk installed: several MB on big images
	maxRPMDB     = 64 << 20 // rpmdb.sqlite
	maxSmall     = 64 << 10 // version files, os-release, one status.d stanza
)

// kind is what a wanted path holds.
type kind int

const (
	kindNone kind = iota
	kindDpkgStatus
	kindDpkgStatusD
	kindApk
	kindRPM
	kindCUDAJSON
	kindCUDATxt
	kindROCmInfo
	kindOSRelease
)

var (
	// usr/local/cuda/, usr/local/cuda-12.4/ (the toolkit's own directory;
	// usr/local/cuda is usually a symlink to it).
	cudaVersionRe = regexp.MustCompile(`^usr/local/cuda[^/]*/version\.(json|txt)$`)
	// opt/rocm-6.2.0/.info/version, version-dev, version-libs, ...
	rocmInfoRe = regexp.MustCompile(`^opt/rocm[^/]*/\.info/version[^/]*$`)
)

func kindOf(p string) kind {
	p = strings.TrimPrefix(p, "/")
	switch p {
	case "var/lib/dpkg/status":
		return kindDpkgStatus
	case "lib/apk/db/installed":
		return kindApk
	case "var/lib/rpm/rpmdb.sqlite", "usr/lib/sysimage/rpm/rpmdb.sqlite":
		return kindRPM
	case "etc/os-release", "usr/lib/os-release":
		return kindOSRelease
	}
	if dir, base := path.Split(p); dir == "var/lib/dpkg/status.d/" {
		// Distroless images keep one control stanza per package here, next
		// to NAME.md5sums files that are not stanzas.
		if base != "" && !strings.HasSuffix(base, ".md5sums") {
			return kindDpkgStatusD
		}
		return kindNone
	}
	if m := cudaVersionRe.FindStringSubmatch(p); m != nil {
		if m[1] == "json" {
			return kindCUDAJSON
		}
		return kindCUDATxt
	}
	if rocmInfoRe.MatchString(p) {
		return kindROCmInfo
	}
	return kindNone
}

// Wants reports whether kiln should read the file at path p (an image
// path, without a leading "/") for the versions it may hold.
func Wants(p string) bool { return kindOf(p) != kindNone }

// MaxBytes is the largest body Read takes for path p; 0 for a path Wants
// rejects.
func MaxBytes(p string) int64 {
	switch kindOf(p) {
	case kindNone:
		return 0
	case kindDpkgStatus, kindApk:
		return maxPackageDB
	case kindRPM:
		return maxRPMDB
	default:
		return maxSmall
	}
}

// Read parses one wanted file and returns the facts found in it. It reads
// at most MaxBytes(p) bytes of body and fails with ErrTooLarge if there
// is more; malformed content fails with an error wrapping ErrMalformed.
// An error concerns this file only.
func Read(p string, body io.Reader) (Facts, error) {
	k := kindOf(p)
	if k == kindNone {
		return Facts{}, fmt.Errorf("%w: %s", ErrNotWanted, p)
	}
	limit := MaxBytes(p)
	if k == kindRPM {
		pk, err := readRPMDB(body, limit)
		if err != nil {
			return Facts{}, fmt.Errorf("%s: %w", p, err)
		}
		return packageFacts(pk), nil
	}
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return Facts{}, fmt.Errorf("%s: %w", p, err)
	}
	if int64(len(b)) > limit {
		return Facts{}, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, p, limit)
	}
	var f Facts
	switch k {
	case kindDpkgStatus:
		f = packageFacts(parseDpkg(b, true))
	case kindDpkgStatusD:
		f = packageFacts(parseDpkg(b, false))
	case kindApk:
		f = packageFacts(parseApk(b))
	case kindCUDAJSON:
		v, ok, err := cudaVersionJSON(b)
		if err != nil {
			return Facts{}, fmt.Errorf("%s: %w", p, err)
		}
		if ok {
			f.CUDA = []Version{{Version: v.Version, From: joinFrom(p, v.From)}}
		}
	case kindCUDATxt:
		v, err := cudaVersionTxt(b)
		if err != nil {
			return Facts{}, fmt.Errorf("%s: %w", p, err)
		}
		f.CUDA = []Version{{Version: v.Version, From: joinFrom(p, v.From)}}
	case kindROCmInfo:
		v, err := ROCmInfoVersion(string(b))
		if err != nil {
			return Facts{}, fmt.Errorf("%s: %w", p, err)
		}
		f.ROCm = []Version{{Version: v, From: p}}
	case kindOSRelease:
		f.OS = parseOSRelease(b)
	}
	return f, nil
}

func joinFrom(p, why string) string {
	if why == "" {
		return p
	}
	return p + " (" + why + ")"
}

func packageFacts(pk []Package) Facts {
	f := Facts{Packages: pk}
	f.CUDA, f.ROCm = FromPackages(pk)
	f.CompatDriver = CompatDrivers(pk)
	return f
}

// Merge adds the facts of another file. Lists are concatenated without
// repeating an identical Version; a non-empty OS replaces the one held, so
// merge files in layer order, lowest first.
func (f *Facts) Merge(o Facts) {
	f.Packages = append(f.Packages, o.Packages...)
	f.CUDA = appendNew(f.CUDA, o.CUDA)
	f.ROCm = appendNew(f.ROCm, o.ROCm)
	f.CompatDriver = appendNew(f.CompatDriver, o.CompatDriver)
	if o.OS != "" {
		f.OS = o.OS
	}
}

func appendNew(to, from []Version) []Version {
next:
	for _, v := range from {
		for _, w := range to {
			if w == v {
				continue next
			}
		}
		to = append(to, v)
	}
	return to
}
