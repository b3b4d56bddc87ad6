package process

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 130 1 000000009d42441d 100 0 0 10 0
   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 333131 2 000000005e227f84 100 0 0 10 0
   2: 0A000005:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 444 2 000000005e227f84 100 0 0 10 0
   3: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1001        0 555 1 0000000000000000 20 4 30 10 -1
`

func TestParseListeners(t *testing.T) {
	got, err := parseListeners([]byte(procNetTCP), 8000)
	if err != nil {
		t.Fatal(err)
	}
	// Only the listener on loopback: not the one on 10.0.0.5, not the
	// established connection.
	if len(got) != 1 || got[0] != 333131 {
		t.Errorf("listeners on 8000: %v, want [333131]", got)
	}
	got, _ = parseListeners([]byte(procNetTCP), 2024)
	if len(got) != 1 || got[0] != 130 {
		t.Errorf("listeners on 2024 (every address): %v, want [130]", got)
	}
	// CRLF, a cut last line, no header.
	cut := strings.ReplaceAll(procNetTCP, "\n", "\r\n")
	cut = cut[strings.Index(cut, "\n")+1 : len(cut)-40]
	got, _ = parseListeners([]byte(cut), 8000)
	if len(got) != 1 || got[0] != 333131 {
		t.Errorf("listeners on 8000 in a cut CRLF file: %v", got)
	}
}

func FuzzParseListeners(f *testing.F) {
	f.Add([]byte(procNetTCP), 8000)
	f.Add([]byte("sl\n 0: :: 0A"), 0)
	f.Fuzz(func(t *testing.T, b []byte, port int) {
		_, _ = parseListeners(b, port)
	})
}

// With the real /proc: the port this process listens on is its own, and
// not that of a process it did not start it under.
func TestCheckPortOnThisMachine(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if err := (&Owned{}).check("/proc", os.Getpid(), port); err != nil {
		t.Errorf("this process's own port: %v", err)
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	if err := (&Owned{}).check("/proc", other.Process.Pid, port); !errors.Is(err, ErrNotTheJobs) {
		t.Errorf("another process's port, as seen for a job rooted at sleep: %v, want ErrNotTheJobs", err)
	}
	ln.Close()
	if err := (&Owned{}).check("/proc", os.Getpid(), port); err == nil || errors.Is(err, ErrNotTheJobs) {
		t.Errorf("a port nothing listens on: %v", err)
	}
}

// The kernel's sock_diag answer and /proc/net/tcp agree on a listener.
func TestDiagListenersAgreeWithProc(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want, err := parseListeners(b, port)
	if err != nil || len(want) != 1 {
		t.Fatalf("/proc/net/tcp: %v %v", want, err)
	}
	got, err := diagListeners(port)
	if err != nil {
		t.Skip("no sock_diag here:", err)
	}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("sock_diag says %v, /proc/net/tcp %v", got, want)
	}
	// A port bound elsewhere than loopback is not one the agent reaches.
	if other, err := diagListeners(port + 1); err == nil && len(other) != 0 {
		t.Logf("port %d has listeners %v (another program)", port+1, other)
	}
}
