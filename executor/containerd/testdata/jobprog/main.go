// jobprog is the only file of the container image kiln's containerd
// executor tests run. Its first argument picks what it does:
//
//	report PATH...  print to stdout and stderr, the KILN_* environment,
//	                what each PATH is, its cgroups; exit 3
//	trap            print "ready", exit 0 on SIGTERM
//	wait            ignore SIGTERM, print "ready", sleep until killed
//	session         print who and where it runs and whether on a
//	                terminal (and its size), then answer lines of input:
//	                "size", "stderr TEXT", "sleep" (until SIGINT: exit 130),
//	                "exit N", anything else "got LINE"; "eof" at its end
//	listen PORT     echo what each connection to 127.0.0.1:PORT sends,
//	                after printing "listening"
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
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
	case "session":
		session()
	case "listen":
		listen(os.Args[2])
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

func session() {
	wd, _ := os.Getwd()
	fmt.Printf("uid %d gid %d\n", os.Getuid(), os.Getgid())
	fmt.Println("cwd", wd)
	fmt.Println("env KILN_TEST_VALUE=" + os.Getenv("KILN_TEST_VALUE"))
	fmt.Println("term", os.Getenv("TERM"))
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		fmt.Print("proc-cgroup ", strings.ReplaceAll(string(b), "\n", " | "), "\n")
	}
	if rows, cols, ok := winSize(); ok {
		fmt.Println("tty yes")
		fmt.Println("size", rows, cols)
	} else {
		fmt.Println("tty no")
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "size":
			rows, cols, _ := winSize()
			fmt.Println("size", rows, cols)
		case strings.HasPrefix(line, "stderr "):
			fmt.Fprintln(os.Stderr, strings.TrimPrefix(line, "stderr "))
		case line == "sleep":
			c := make(chan os.Signal, 1)
			signal.Notify(c, syscall.SIGINT)
			fmt.Println("sleeping")
			<-c
			fmt.Println("interrupted")
			os.Exit(130)
		case strings.HasPrefix(line, "exit "):
			n, _ := strconv.Atoi(strings.TrimPrefix(line, "exit "))
			os.Exit(n)
		default:
			fmt.Println("got", line)
		}
	}
	fmt.Println("eof")
}

// winSize is the size of the terminal on stdin, if it is one.
func winSize() (rows, cols uint16, ok bool) {
	var ws [4]uint16
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	return ws[0], ws[1], errno == 0
}

func listen(port string) {
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}
