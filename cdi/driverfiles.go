package cdi

import (
	"debug/elf"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// mountOptions are the options of every driver file mount: read-only,
// no device files, no set-uid.
var mountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// nvidiaMounts mounts the caller's driver files into the container, once
// for the spec.
func (g *generator) nvidiaMounts() []*cdispec.Mount {
	if g.nvMounted {
		return g.nvMounts
	}
	g.nvMounted = true
	seen := map[string]bool{}
	add := func(host, ctr string) {
		if seen[ctr] {
			return
		}
		seen[ctr] = true
		g.nvMounts = append(g.nvMounts, &cdispec.Mount{
			HostPath: host, ContainerPath: ctr, Type: "bind",
			Options: append([]string(nil), mountOptions...),
		})
	}
	for _, lib := range g.opts.NVIDIALibraries {
		if !cleanAbs(lib) {
			g.note("driver library %q left out: not an absolute, clean path", lib)
			continue
		}
		base := path.Base(lib)
		add(lib, path.Join(g.opts.LibraryDir, base))
		if so := soname(g.opts.Root, lib); so != "" && so != base {
			add(lib, path.Join(g.opts.LibraryDir, so))
		}
	}
	for _, bin := range g.opts.NVIDIABinaries {
		if !cleanAbs(bin) {
			g.note("driver tool %q left out: not an absolute, clean path", bin)
			continue
		}
		add(bin, path.Join(g.opts.BinaryDir, path.Base(bin)))
	}
	return g.nvMounts
}

// soname reads a shared library's DT_SONAME ("libcuda.so.1"); empty when
// the file is not an ELF library or the name is not a plain file name.
func soname(root fs.FS, hostPath string) string {
	f, err := root.Open(strings.TrimPrefix(hostPath, "/"))
	if err != nil {
		return ""
	}
	defer f.Close()
	ra, ok := f.(io.ReaderAt)
	if !ok {
		return ""
	}
	ef, err := elf.NewFile(ra)
	if err != nil {
		return ""
	}
	defer ef.Close()
	names, err := ef.DynString(elf.DT_SONAME)
	if err != nil || len(names) != 1 {
		return ""
	}
	so := names[0]
	if so == "" || so == "." || so == ".." || strings.ContainsAny(so, "/\x00") {
		return ""
	}
	return so
}

// nvidiaLibraries are the driver's user-space libraries a CUDA, NVML or
// OpenCL job loads; each is installed as lib<name>.so.<driver version>.
var nvidiaLibraries = []string{
	"libcuda", "libcudadebugger", "libnvidia-ml", "libnvidia-ptxjitcompiler",
	"libnvidia-nvvm", "libnvidia-gpucomp", "libnvidia-opencl", "libnvidia-cfg",
	"libnvidia-allocator", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
}

// nvidiaBinaries are the driver tools a job may call.
var nvidiaBinaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

// Directories where distributions and NVIDIA's installer put the driver.
var (
	libraryDirs = []string{
		"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64",
		"usr/lib", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64",
		"usr/lib/x86_64-linux-gnu/nvidia/current", "usr/lib/aarch64-linux-gnu/nvidia/current",
	}
	binaryDirs = []string{"usr/bin", "usr/local/bin", "usr/sbin", "bin"}
)

// FindNVIDIADriverFiles looks in root (the host, "/" as os.DirFS) for the
// NVIDIA user-space driver files of one driver version ("535.183.01", as
// snapshot.Drivers.NVIDIAUser holds it), and returns their host paths, to
// pass as Options.NVIDIALibraries and Options.NVIDIABinaries. Only files of
// that exact version are taken: a container must get the libraries that
// match the loaded kernel module.
func FindNVIDIADriverFiles(root fs.FS, driverVersion string) (libraries, binaries []string) {
	if driverVersion == "" || strings.ContainsAny(driverVersion, "/*?[\\") {
		return nil, nil
	}
	seen := map[string]bool{}
	for _, dir := range libraryDirs {
		for _, lib := range nvidiaLibraries {
			name := path.Join(dir, lib+".so."+driverVersion)
			if seen[path.Base(name)] || !isFile(root, name) {
				continue
			}
			seen[path.Base(name)] = true
			libraries = append(libraries, "/"+name)
		}
	}
	for _, bin := range nvidiaBinaries {
		for _, dir := range binaryDirs {
			name := path.Join(dir, bin)
			if isFile(root, name) {
				binaries = append(binaries, "/"+name)
				break
			}
		}
	}
	sort.Strings(libraries)
	return libraries, binaries
}

func isFile(root fs.FS, name string) bool {
	st, err := fs.Stat(root, name)
	return err == nil && st.Mode().IsRegular()
}
