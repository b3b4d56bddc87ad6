// Command doctor measures the whole `kiln doctor --from` process on 8-GPU
// captures and on a 50 MB kernel log: wall time and peak resident memory,
// as a table. The goals are under 50 ms and 30 MB for an 8-GPU nvidia-smi
// capture, and under 2 s and 100 MB for the 50 MB log.
//
//	go run ./bench/doctor [-n 20]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"kiln.dev/kiln/bench/kilnbin"
)

func main() {
	n := flag.Int("n", 20, "runs per capture")
	flag.Parse()
	dir, err := os.MkdirTemp("", "kiln-bench")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	bin, err := kilnbin.Build(dir)
	if err != nil {
		fail(err)
	}
	bigLog := filepath.Join(dir, "kernel-50mb.log")
	if err := writeBigLog(bigLog, 50<<20); err != nil {
		fail(fmt.Errorf("writing the 50 MB log: %w", err))
	}
	captures := [][]string{
		{"testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"},
		{"testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt"},
		{"testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt", "testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt", "testdata/captures/dmesg/h100-hgx-boot-dmesg-iso.log"},
		{"testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"},
		{bigLog},
	}
	fmt.Printf("%-70s %8s %8s %8s %10s\n", "capture (8 GPUs)", "runs", "p50 ms", "max ms", "peak MB")
	for _, c := range captures {
		var walls []float64
		var peak int64
		for i := 0; i < *n; i++ {
			args := []string{"doctor", "-o", "json"}
			for _, f := range c {
				args = append(args, "--from", f)
			}
			cmd := exec.Command(bin, args...)
			start := time.Now()
			err := cmd.Run()
			walls = append(walls, float64(time.Since(start).Microseconds())/1000)
			if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 3 {
				fail(fmt.Errorf("%v: kiln could not run", c))
			}
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru.Maxrss > peak {
				peak = ru.Maxrss
			}
		}
		sort.Float64s(walls)
		name := filepath.Base(c[0])
		if c[0] == bigLog {
			name = "kernel log, 50 MB (the corpus's logs repeated)"
		}
		if len(c) > 1 {
			name = fmt.Sprintf("%s + %d more", name, len(c)-1)
		}
		fmt.Printf("%-70s %8d %8.1f %8.1f %10.1f\n", name, *n, walls[len(walls)/2], walls[len(walls)-1], float64(peak)/1024)
	}
}

// writeBigLog writes a kernel log of at least size bytes: every kernel log
// of the corpus, one after the other, again and again (boots, Xid storms,
// AER reports, amdgpu resets, collector prefixes and locales mixed).
func writeBigLog(path string, size int64) error {
	logs, err := filepath.Glob("testdata/captures/dmesg/*.log")
	if err != nil || len(logs) == 0 {
		return fmt.Errorf("no kernel logs in testdata/captures/dmesg: %v", err)
	}
	var all []byte
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			return err
		}
		all = append(all, b...)
		if len(b) > 0 && b[len(b)-1] != '\n' {
			all = append(all, '\n')
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var n int64
	for n < size {
		m, err := f.Write(all)
		if err != nil {
			f.Close()
			return err
		}
		n += int64(m)
	}
	return f.Close()
}

// copyFile copies the executable src to dst, streaming: a child's peak
// memory starts from what its parent holds when it forks, so the bench
// keeps no copy of the binary in its own memory.
func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
