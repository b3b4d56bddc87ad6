// jobprog is the only file of the container image kiln's containerd
// executor tests run. Its first argument picks what it does:
//
//	report PATH...  print to stdout and stderr, the KILN_* environment,
//	                what each PATH is, its cgroups; exit 3
//	trap            print "ready", exit 0 on SIGTERM
//	wait            ignore SIGTERM, print "ready", sleep until killed
package main

import (
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: jobprog report|trap|wait")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "report":
		report(os.Args[2:])
		os.Exit(3)
	case "trap":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		<-c
		fmt.Println("terminated")
	case "wait":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		for {
			time.Sleep(time.Hour)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func report(paths []string) {
	fmt.Println("hello from a kiln job")
	fmt.Fprintln(os.Stderr, "this line went to stderr")
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KILN_") || strings.HasPrefix(kv, "CUDA_") {
			env = append(env, kv)
		}
	}
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println("env", kv)
	}
	wd, _ := os.Getwd()
	fmt.Println("cwd", wd)
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			fmt.Printf("path %s: missing\n", p)
			continue
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFCHR:
			fmt.Printf("path %s: char %d:%d\n", p, (st.Rdev>>8)&0xfff, (st.Rdev&0xff)|((st.Rdev>>12)&0xfff00))
		case syscall.S_IFREG:
			fmt.Printf("path %s: file %d bytes\n", p, st.Size)
		default:
			fmt.Printf("path %s: other\n", p)
		}
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		fmt.Print("proc-cgroup ", strings.ReplaceAll(string(b), "\n", " | "), "\n")
	}
}
