package process

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln.dev/kiln/executor"
)

// JobOptions are what a job may carry beyond executor.Job.
type JobOptions struct {
	// User is the kiln user the job runs for (UsersPerKilnUser); Start
	// takes it from the job's KILN_USER.
	User string
	// Require lists what the job must get (GiveOwnUser, GivePIDNamespace,
	// ...): a job asking for more than the executor delivers does not
	// start.
	Require []string
}

// cleanPath is the PATH of a job that sets none.
const cleanPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Delivered says what the executor gives every job here (Sandbox), found
// once by starting a job init that sets up its namespaces. Without a
// Sandbox, jobs run as the agent with its environment, and it says so.
func (e *Executor) Delivered() Delivered {
	e.probeOnce.Do(func() { e.delivered = e.probe() })
	return e.delivered
}

func (e *Executor) probe() Delivered {
	if e.Sandbox == nil {
		return Delivered{User: "the agent's own user", Missing: []string{
			"own-user: jobs run as the agent's user, with its environment (the executor has no sandbox)"}}
	}
	sb := e.sandboxDefaults()
	d := Delivered{CleanEnv: true}
	if err := e.checkSandbox(); err != nil {
		d.User = "none: " + err.Error()
		d.Missing = append(d.Missing, "own-user: "+err.Error())
		return d
	}
	switch sb.Users {
	case UsersPerLease:
		d.User, d.OwnUser = fmt.Sprintf("per-lease uid from %d-%d", sb.FirstUID, sb.LastUID), true
	case UsersPerKilnUser:
		d.User, d.OwnUser = fmt.Sprintf("per-kiln-user uid from %d-%d", sb.FirstUID, sb.LastUID), true
	default:
		id, _ := lookupUser(sb.User, nil)
		if id.uid == uint32(os.Getuid()) {
			d.User = id.name + ", the agent's own user, for every job (a single-user machine)"
			d.Missing = append(d.Missing, "own-user: every job runs as the agent's own user (--job-user)")
		} else {
			d.User, d.OwnUser = id.name+" for every job", true
		}
	}
	// The namespaces, tried with a job init that only sets them up.
	flags := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS)
	if sb.NoNamespaces {
		d.Missing = append(d.Missing, "pid-namespace, mount-namespace: turned off")
		flags = 0
	} else if err := e.runInit(flags, initConfig{Probe: true, Mounts: true, NewProc: true}); err != nil {
		d.Missing = append(d.Missing, "pid-namespace, mount-namespace: the kernel refused them: "+err.Error())
		flags = 0
	}
	if flags != 0 {
		d.PIDNamespace, d.MountNamespace, d.PrivateTmp, d.Devices = true, true, true, true
	} else {
		d.Missing = append(d.Missing, "private-tmp: only TMPDIR points to a private directory", "devices: every GPU device node the job's user may open is reachable")
	}
	if err := e.runInit(flags, initConfig{Probe: true, Mounts: flags != 0, NewProc: flags != 0}); err == nil {
		d.NoNewPrivs = true
	} else {
		d.Missing = append(d.Missing, "no-new-privileges: "+err.Error())
	}
	if err := e.cgroupRoot(); err != nil {
		d.Missing = append(d.Missing, "cgroup: "+err.Error())
	} else {
		d.Cgroup = true
	}
	e.nsFlags = flags
	return d
}

// runInit runs the job init in probe mode and waits for it.
func (e *Executor) runInit(flags uintptr, cfg initConfig) error {
	cmd, st, err := startInit(flags, cfg, nil, -1, nil)
	if err != nil {
		return err
	}
	defer st.c.Close()
	first := st.line()
	err = cmd.Wait()
	if !strings.HasPrefix(first, "started") {
		if first == "" {
			return fmt.Errorf("the job init ended (%v)", err)
		}
		return errors.New(strings.TrimPrefix(first, "error "))
	}
	return err
}

// startInit starts the job init with cfg; out takes its output.
// ctl, when given, becomes its control socket (fd 5).
func startInit(flags uintptr, cfg initConfig, out *logBuffer, cgroupFD int, ctl *os.File) (*exec.Cmd, *initStatus, error) {
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	stR, stW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		cfgW.Close()
		return nil, nil, err
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{jobInitArg0}
	cmd.Env = []string{jobInitEnv + "=1"}
	cmd.ExtraFiles = []*os.File{cfgR, stW}
	if ctl != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, ctl)
	}
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: flags, Pdeathsig: 0}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgroupFD
	}
	err = cmd.Start()
	cfgR.Close()
	stW.Close()
	if err != nil {
		cfgW.Close()
		stR.Close()
		return nil, nil, fmt.Errorf("starting the job init: %w", err)
	}
	if err := json.NewEncoder(cfgW).Encode(cfg); err != nil {
		cfgW.Close()
		stR.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, nil, err
	}
	cfgW.Close()
	return cmd, &initStatus{r: bufio.NewReader(stR), c: stR}, nil
}

// StartWith runs a job with options executor.Job has no room for.
func (e *Executor) StartWith(ctx context.Context, job executor.Job, o JobOptions) (executor.Handle, error) {
	if e.Sandbox == nil {
		if len(o.Require) > 0 {
			return nil, fmt.Errorf("process executor: the job requires %s, and this node runs jobs without a sandbox (as the agent's user)", strings.Join(o.Require, ", "))
		}
		return e.startPlain(ctx, job)
	}
	return e.startSandboxed(ctx, job, o)
}

func (e *Executor) startSandboxed(ctx context.Context, job executor.Job, o JobOptions) (executor.Handle, error) {
	if err := checkJob(job); err != nil {
		return nil, err
	}
	d := e.Delivered()
	var weaker []string
	for _, r := range o.Require {
		if !d.Has(r) {
			weaker = append(weaker, r)
		}
	}
	if len(weaker) > 0 {
		return nil, fmt.Errorf("process executor: the job requires %s, which this node does not give (%s): refused rather than run with less", strings.Join(weaker, ", "), strings.Join(d.Missing, "; "))
	}
	if !d.OwnUser && !strings.Contains(d.User, "single-user") {
		return nil, fmt.Errorf("process executor: no user to run the job as: %s", d.User)
	}
	if o.User == "" {
		o.User = job.Env["KILN_USER"]
	}
	sb := e.sandboxDefaults()
	for _, h := range append([]string{e.StateDir}, sb.Hide...) {
		if h != "" && underDir(sb.WorkRoot, h) {
			return nil, fmt.Errorf("process executor: the job directory root %s is inside %s, which jobs may not see", sb.WorkRoot, h)
		}
	}
	id, err := e.acquire(job.LeaseID, o.User)
	if err != nil {
		return nil, err
	}
	if id.uid == 0 || (id.uid == uint32(os.Getuid()) && os.Geteuid() == 0) {
		e.release(job.LeaseID, id)
		return nil, errors.New("process executor: refusing to run a job as root or as the agent's user")
	}
	dir, err := e.workDir(job.ID, id)
	if err != nil {
		e.release(job.LeaseID, id)
		return nil, fmt.Errorf("process executor: %w", err)
	}
	cleanup := func() {
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(dir + ".tmp")
		e.release(job.LeaseID, id)
	}
	cwd := dir
	if job.WorkDir != "" {
		cwd = job.WorkDir
	}
	env := e.jobEnv(job, dir, d)
	cfg := initConfig{Argv: job.Command, Env: env, Dir: cwd, UID: id.uid, GID: id.gid, Groups: id.groups,
		Mounts: e.nsFlags != 0, NewProc: e.nsFlags != 0, Tmp: dir + ".tmp", Keep: []string{dir, cwd}}
	if e.nsFlags != 0 {
		cfg.Hide = append([]string{}, sb.Hide...)
		if e.StateDir != "" {
			cfg.Hide = append(cfg.Hide, e.StateDir)
		}
		allowed := map[string]bool{}
		for _, dev := range job.Devices {
			allowed[strings.ToLower(dev.PCIAddress)] = true
		}
		cfg.Devices = deviceNodes(allowed)
	}
	h := &handle{logs: newLogBuffer(e.MaxLogBytes), done: make(chan struct{}), cleanup: cleanup}
	fmt.Fprintf(h.logs, "kiln: sandbox: %s; user %s\n", d, id.name)
	fd := -1
	if d.Cgroup {
		gdir, gfd, err := e.cgroup(job, sb.PidsMax)
		if err != nil {
			fmt.Fprintf(h.logs, "kiln: cgroup limits not applied: %v\n", err)
		} else {
			h.cgroup, fd = gdir, gfd
			defer syscall.Close(gfd)
		}
	} else if job.Limits.CPUMilli > 0 || job.Limits.MemoryBytes > 0 {
		fmt.Fprintf(h.logs, "kiln: cgroup limits not applied: no cgroup v2 here\n")
	}
	initCtl, ctl, err := newCtlPair()
	if err != nil {
		h.removeCgroup()
		cleanup()
		return nil, fmt.Errorf("process executor: %w", err)
	}
	cfg.Control = true
	h.ctl, h.uid, h.gid = ctl, int(id.uid), int(id.gid)
	cmd, st, err := startInit(e.nsFlags, cfg, h.logs, fd, initCtl)
	initCtl.Close()
	if err != nil {
		ctl.close()
		h.removeCgroup()
		cleanup()
		return nil, err
	}
	first := st.line()
	if !strings.HasPrefix(first, "started") {
		_ = cmd.Wait()
		st.c.Close()
		ctl.close()
		h.removeCgroup()
		cleanup()
		msg := strings.TrimPrefix(first, "error ")
		if first == "" {
			msg = "the job init ended before the job started"
		}
		return nil, fmt.Errorf("process executor: %s", msg)
	}
	h.cmd, h.status = cmd, st
	if e.nsFlags == 0 {
		// Without a PID namespace the job's group is outside the init's.
		h.jobPID, _ = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "started")))
	}
	e.keepRecord(h, job)
	go h.wait()
	return h, nil
}

// jobEnv is a sandboxed job's whole environment: nothing of the agent's
// but LANG, and PATH when the job sets none.
func (e *Executor) jobEnv(job executor.Job, dir string, d Delivered) []string {
	base := []string{"PATH=" + cleanPath, "HOME=" + dir, "TMPDIR=/tmp"}
	if lang := os.Getenv("LANG"); lang != "" {
		base = append(base, "LANG="+lang)
	} else {
		base = append(base, "LANG=C.UTF-8")
	}
	if e.nsFlags == 0 {
		base[2] = "TMPDIR=" + dir + ".tmp"
	}
	extra := map[string]string{"KILN_JOB_ID": job.ID, "KILN_LEASE_ID": job.LeaseID, "KILN_SANDBOX": d.String()}
	for k, v := range Env(job.Devices) {
		extra[k] = v
	}
	env := environ(base, job.Env, extra)
	// The job may not move its home or its TMPDIR out of its sandbox.
	for i, kv := range env {
		if strings.HasPrefix(kv, "HOME=") {
			env[i] = "HOME=" + dir
		}
	}
	return env
}

// keepRecord writes the job's record for Reap.
func (e *Executor) keepRecord(h *handle, job executor.Job) {
	if e.StateDir == "" {
		return
	}
	r := record{Job: job.ID, Lease: job.LeaseID, PID: h.cmd.Process.Pid}
	var err error
	if r.Start, err = procStart(r.PID); err == nil {
		err = e.writeRecord(r)
	}
	if err != nil {
		fmt.Fprintf(h.logs, "kiln: no record of this job kept; if the agent crashes it is not found again: %v\n", err)
	} else {
		h.record = e.recordPath(job.ID)
	}
}

// exitOf reads how the job ended from the init's last report.
func exitOf(line string) (executor.Exit, bool) {
	ex := executor.Exit{Reason: "exited", Finished: time.Now()}
	verb, arg, _ := strings.Cut(line, " ")
	n, err := strconv.Atoi(arg)
	if err != nil {
		return ex, false
	}
	switch verb {
	case "exit":
		ex.Code = n
	case "signal":
		ex.Signal = syscall.Signal(n).String()
		ex.Code = 128 + n
	default:
		return ex, false
	}
	return ex, true
}
