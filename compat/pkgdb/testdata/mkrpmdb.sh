#!/bin/sh
# Regenerates rpmdb.sqlite.gz: a real rpm sqlite database holding empty
# noarch packages named and versioned like those of RHEL 9 images with
# NVIDIA's and AMD's repositories. Needs rpm and rpmbuild (Debian/Ubuntu:
# apt-get install rpm; the test data was made with rpm 4.18.0).
# Run from this directory: sh mkrpmdb.sh
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mk() { # name version release [epoch]
	{
		echo "Name: $1"
		echo "Version: $2"
		echo "Release: $3"
		if [ -n "${4:-}" ]; then echo "Epoch: $4"; fi
		echo "Summary: kiln test package"
		echo "License: MIT"
		echo "BuildArch: noarch"
		echo "%description"
		echo "kiln test package"
		echo "%files"
	} >"$work/$1.spec"
	rpmbuild -bb --quiet --define "_topdir $work/top" "$work/$1.spec" >/dev/null
}
mk cuda-cudart-12-4 12.4.127 1
mk cuda-compat-12-4 550.54.15 1
mk rocm-core 6.2.0.60200 66.el9
mk amd-smi-lib 24.6.2.60200 66.el9
mk amdgpu-core 6.2.60200 2009582.el9 1
mk zlib 1.2.11 40.el9
mkdir "$work/db"
rpm --initdb --dbpath "$work/db"
rpm -i --justdb --nodeps --ignorearch --ignoreos --nosignature --dbpath "$work/db" "$work"/top/RPMS/noarch/*.rpm 2>/dev/null
rpm -qa --dbpath "$work/db" --qf '%{NAME} %{EPOCH} %{VERSION} %{RELEASE}\n' >&2
gzip -9 -n -c "$work/db/rpmdb.sqlite" >rpmdb.sqlite.gz
