package process

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The job init is the agent's own binary started again (/proc/self/exe)
// with argv[0] jobInitArg0 and jobInitEnv set: this package's init
// function runs it instead of the program. It reads its configuration on
// fd 3 and reports on fd 4: "started" or "error MESSAGE" once the job runs
// (or could not start), then "exit CODE" or "signal NUMBER" when it ended.
const (
	jobInitArg0 = "kiln-job-init"
	jobInitEnv  = "KILN_JOB_INIT"
)

func init() {
	if len(os.Args) > 0 && os.Args[0] == jobInitArg0 && os.Getenv(jobInitEnv) == "1" {
		os.Exit(runJobInit())
	}
}

// initConfig is what the executor tells the job init.
type initConfig struct {
	Probe   bool     `json:"probe,omitempty"` // set up, report, exit
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	Groups  []uint32 `json:"groups,omitempty"`
	Mounts  bool     `json:"mounts"` // a mount namespace of its own
	NewProc bool     `json:"new_proc"`
	Tmp     string   `json:"tmp,omitempty"`
	// Keep are directories that must stay where they are when /tmp or
	// /var/tmp is covered (the job's home and working directory).
	Keep    []string `json:"keep,omitempty"`
	Hide    []string `json:"hide,omitempty"`
	Devices []string `json:"devices,omitempty"` // device nodes to cover
	// Control: fd 5 is a control socket for sessions beside the job.
	Control bool `json:"control,omitempty"`
}

func runJobInit() int {
	status := os.NewFile(4, "status")
	report := func(format string, args ...any) { fmt.Fprintf(status, format+"\n", args...) }
	syscall.CloseOnExec(4)
	cfgFile := os.NewFile(3, "config")
	var cfg initConfig
	err := json.NewDecoder(cfgFile).Decode(&cfg)
	cfgFile.Close()
	if err != nil {
		report("error reading the job's configuration: %v", err)
		return 127
	}
	if err := setupMounts(&cfg); err != nil {
		report("error %v", err)
		return 127
	}
	// No program the job runs gains privileges (setuid, file
	// capabilities): the init keeps its own, which it needs no more.
	if err := noNewPrivs(); err != nil {
		report("error no-new-privileges: %v", err)
		return 127
	}
	// Without a PID namespace of its own, what the job leaves behind
	// comes to the init, which reaps it.
	_ = prctl(36, 1) // PR_SET_CHILD_SUBREAPER
	if cfg.Probe {
		report("started")
		report("exit 0")
		return 0
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		report("error %v", err)
		return 127
	}
	reaped := func(int, syscall.WaitStatus) bool { return false }
	ended := func() {}
	// Taken before the job starts, so that the job does not inherit it.
	sess := openInitSessions(&cfg)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	prog := cfg.Argv[0]
	if !strings.Contains(prog, "/") {
		if p, ok := lookPath(prog, cfg.Env); ok {
			prog = p
		}
	}
	p, err := os.StartProcess(prog, cfg.Argv, &os.ProcAttr{
		Dir:   cfg.Dir,
		Env:   cfg.Env,
		Files: []*os.File{devnull, os.Stdout, os.Stderr},
		Sys: &syscall.SysProcAttr{Setpgid: true,
			Credential: &syscall.Credential{Uid: cfg.UID, Gid: cfg.GID, Groups: append([]uint32{}, cfg.Groups...)}},
	})
	devnull.Close()
	if err != nil {
		report("error starting %s: %v", cfg.Argv[0], err)
		return 127
	}
	report("started %d", p.Pid)
	if sess != nil {
		go sess.serve()
		reaped, ended = sess.reaped, sess.end
	}
	go func() {
		for s := range sigs {
			_ = syscall.Kill(-p.Pid, s.(syscall.Signal))
		}
	}()
	var main syscall.WaitStatus
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			break // no child left
		}
		if reaped(pid, ws) {
			continue
		}
		if pid == p.Pid {
			main = ws
			ended()
			// The job is over: what it left goes with it.
			_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
			if os.Getpid() == 1 {
				_ = syscall.Kill(-1, syscall.SIGKILL)
			} else {
				killChildren()
			}
		}
	}
	if main.Signaled() {
		report("signal %d", int(main.Signal()))
	} else {
		report("exit %d", main.ExitStatus())
	}
	return 0
}

// setupMounts gives the job its view of the file system, in its own mount
// namespace: nothing propagates back, /proc shows its PID namespace, /tmp,
// /var/tmp and /dev/shm are its own, kiln's paths are covered by empty
// read-only file systems and other GPUs' device nodes by /dev/null.
func setupMounts(cfg *initConfig) error {
	if !cfg.Mounts {
		return nil
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	if cfg.NewProc {
		if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mounting /proc: %w", err)
		}
	}
	// Hidden first: some may lie under /tmp.
	for _, p := range cfg.Hide {
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		if st.IsDir() {
			err = syscall.Mount("tmpfs", p, "tmpfs", syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "size=4k,mode=000")
		} else {
			err = bindNull(p)
		}
		if err != nil {
			return fmt.Errorf("hiding %s: %w", p, err)
		}
	}
	for _, p := range cfg.Devices {
		if err := bindNull(p); err != nil {
			return fmt.Errorf("hiding the device %s: %w", p, err)
		}
	}
	if cfg.Tmp != "" {
		// The directories to keep are held open across the covering
		// mounts and bound back where they were.
		src, err := openPath(cfg.Tmp)
		if err != nil {
			return fmt.Errorf("the job's tmp: %w", err)
		}
		type kept struct {
			path string
			fd   int
		}
		var keep []kept
		for _, p := range cfg.Keep {
			if p == "" || !(underDir(p, "/tmp") || underDir(p, "/var/tmp")) {
				continue
			}
			fd, err := openPath(p)
			if err != nil {
				return fmt.Errorf("the job's directory %s: %w", p, err)
			}
			keep = append(keep, kept{p, fd})
		}
		for _, d := range []string{"/var/tmp", "/tmp"} {
			if st, err := os.Lstat(d); err != nil || !st.IsDir() {
				continue
			}
			if err := syscall.Mount(fdPath(src), d, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
				return fmt.Errorf("a private %s: %w", d, err)
			}
		}
		for _, k := range keep {
			if err := os.MkdirAll(k.path, 0o755); err != nil {
				return fmt.Errorf("keeping %s: %w", k.path, err)
			}
			if err := syscall.Mount(fdPath(k.fd), k.path, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
				return fmt.Errorf("keeping %s: %w", k.path, err)
			}
			syscall.Close(k.fd)
		}
		syscall.Close(src)
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			if err := syscall.Mount("tmpfs", "/dev/shm", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777"); err != nil {
				return fmt.Errorf("a private /dev/shm: %w", err)
			}
		}
	}
	return nil
}

// openPath opens a directory to refer to it by /proc/self/fd/N.
func openPath(p string) (int, error) {
	return syscall.Open(p, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// underDir reports whether p is dir or inside it (after links).
func underDir(p, dir string) bool {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func bindNull(p string) error {
	if err := syscall.Mount(os.DevNull, p, "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	return syscall.Mount("", p, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
}

func prctl(option int, arg uintptr) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, uintptr(option), arg, 0); e != 0 {
		return e
	}
	return nil
}

// noNewPrivs sets PR_SET_NO_NEW_PRIVS (38).
func noNewPrivs() error { return prctl(38, 1) }

// killChildren kills the init's children (what the job left, re-parented
// to the init as its subreaper).
func killChildren() {
	me := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == me {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// lookPath finds a program in the job's PATH.
func lookPath(prog string, env []string) (string, bool) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range strings.Split(path, ":") {
		if d == "" {
			continue
		}
		p := d + "/" + prog
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// initStatus reads the init's reports.
type initStatus struct {
	r *bufio.Reader
	c io.Closer
}

// lastReport reads the reports left and returns the last one.
func (s *initStatus) lastReport() string {
	last := ""
	for {
		l := s.line()
		if l == "" {
			return last
		}
		last = l
	}
}

// line reads the next report; "" when the init is gone.
func (s *initStatus) line() string {
	l, err := s.r.ReadString('\n')
	if err != nil && l == "" {
		return ""
	}
	return strings.TrimSpace(l)
}

// oPath is Linux's O_PATH (the syscall package does not name it).
const oPath = 0x200000
