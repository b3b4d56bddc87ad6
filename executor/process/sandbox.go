package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// How jobs get their identity (Sandbox.Users).
const (
	// UsersPerLease gives every lease a uid of its own from the range,
	// free again (and any process left under it killed) when the lease's
	// last job ends.
	UsersPerLease = "per-lease"
	// UsersPerKilnUser gives every kiln user a uid of their own from the
	// range, kept in the state directory.
	UsersPerKilnUser = "per-user"
	// UsersFixed runs every job as one named user: a single-user
	// machine's choice (kiln agent --job-user NAME).
	UsersFixed = "fixed"
)

// What a sandbox can deliver, by the names a lease asks for them with.
const (
	GiveOwnUser        = "own-user"        // not root, not the agent's user
	GivePIDNamespace   = "pid-namespace"   // sees only its own processes
	GiveMountNamespace = "mount-namespace" // kiln's files hidden, /tmp and /dev/shm private
	GiveCgroup         = "cgroup"          // CPU, memory and pids limits enforced (cgroup v2)
	GiveDevices        = "devices"         // only the lease's GPU device nodes reachable
)

// Sandbox says how the process executor keeps jobs away from kiln and
// from each other. Each job runs under an init of kiln's (the agent's own
// binary started again) that, where the kernel allows, gives it its own PID
// and mount namespaces: it mounts a /proc that shows only the job's
// processes, a private /tmp, /var/tmp and /dev/shm, hides kiln's files
// (Hide) and the device nodes of GPUs the lease does not hold, sets
// no-new-privileges, then starts the job as its user, forwards signals to
// it and reaps what it leaves. The job's environment is clean: what the
// lease sets, kiln's variables and the GPU variables, PATH, HOME, LANG and
// TMPDIR; its working directory and HOME are a private directory (0700) of
// its own under WorkRoot.
type Sandbox struct {
	// Users is UsersPerLease (the default), UsersPerKilnUser or
	// UsersFixed.
	Users string
	// FirstUID and LastUID bound the uids given to leases or kiln users
	// (default 700000-799999); a uid that exists in the user database is
	// skipped.
	FirstUID, LastUID uint32
	// User is the user (name or uid) of UsersFixed.
	User string
	// Groups are supplementary groups of every job (names or gids), such
	// as render and video, which AMD GPUs' device nodes need.
	Groups []string
	// WorkRoot holds each job's private directory (default
	// /var/lib/kiln-jobs). It and its parents must be enterable by the
	// jobs' users; it is made 0711, owned by the agent.
	WorkRoot string
	// Hide are paths jobs must not see: kiln's data directory and the
	// agent's state. With a mount namespace an empty read-only file system
	// covers each; without, their modes (0700/0600) are what keeps jobs
	// out.
	Hide []string
	// PidsMax bounds the processes of a job when cgroups are there
	// (default 4096).
	PidsMax int
	// NoNamespaces turns the namespaces off (they are used where the
	// kernel allows).
	NoNamespaces bool
}

// Delivered is what the executor gives every job on this machine, and what
// it cannot give and why. The agent sends it to the server with the node's
// snapshot; leases state it, and jobs see it in KILN_SANDBOX.
type Delivered struct {
	// User says who jobs run as: "per-lease uid from 700000-799999",
	// "uid 1001 (kiln-jobs) for every job", "the agent's own user".
	User           string
	OwnUser        bool // neither root nor the agent's user
	PIDNamespace   bool
	MountNamespace bool
	PrivateTmp     bool
	CleanEnv       bool
	NoNewPrivs     bool
	Cgroup         bool
	Devices        bool
	// Missing says, for each thing not delivered, why.
	Missing []string
}

// Has reports whether what is asked (GiveOwnUser, ...) is delivered.
func (d Delivered) Has(what string) bool {
	switch what {
	case GiveOwnUser:
		return d.OwnUser
	case GivePIDNamespace:
		return d.PIDNamespace
	case GiveMountNamespace:
		return d.MountNamespace
	case GiveCgroup:
		return d.Cgroup
	case GiveDevices:
		return d.Devices
	}
	return false
}

// String is the statement a job finds in KILN_SANDBOX.
func (d Delivered) String() string {
	parts := []string{"user=" + d.User}
	for _, f := range []struct {
		on   bool
		name string
	}{{d.PIDNamespace, GivePIDNamespace}, {d.MountNamespace, GiveMountNamespace}, {d.PrivateTmp, "private-tmp"}, {d.CleanEnv, "clean-env"},
		{d.NoNewPrivs, "no-new-privileges"}, {d.Cgroup, GiveCgroup}, {d.Devices, GiveDevices}} {
		if f.on {
			parts = append(parts, f.name)
		} else {
			parts = append(parts, "no-"+f.name)
		}
	}
	return strings.Join(parts, "; ")
}

// jobUsers hands out the uids of every executor of the process: kiln up
// runs several agents, each with an executor, over one uid range.
var jobUsers users

// has reports whether an executor of this process gave uid to a job
// that still runs.
func (u *users) has(uid uint32) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.inUse[uid]
}

// identity is the uid, gid and groups a job runs with.
type identity struct {
	uid, gid uint32
	groups   []uint32
	name     string // what the statement calls it
}

// users hands out job identities.
type users struct {
	mu      sync.Mutex
	byLease map[string]uint32 // per-lease: lease -> uid
	jobs    map[string]int    // per-lease: lease -> jobs running
	byUser  map[string]uint32 // per-user: kiln user -> uid
	inUse   map[uint32]bool
	loaded  bool
}

func (e *Executor) sandboxDefaults() *Sandbox {
	s := *e.Sandbox
	if s.Users == "" {
		s.Users = UsersPerLease
	}
	if s.FirstUID == 0 && s.LastUID == 0 {
		s.FirstUID, s.LastUID = 700000, 799999
	}
	if s.WorkRoot == "" {
		s.WorkRoot = "/var/lib/kiln-jobs"
	}
	if s.PidsMax <= 0 {
		s.PidsMax = 4096
	}
	return &s
}

// checkSandbox refuses a sandbox that would run jobs as root, or (for an
// agent that is root) as the agent's user.
func (e *Executor) checkSandbox() error {
	sb := e.sandboxDefaults()
	switch sb.Users {
	case UsersPerLease, UsersPerKilnUser:
		if os.Geteuid() != 0 {
			return fmt.Errorf("process executor: giving each %s a user of its own needs root; on a single-user machine name the user jobs run as (kiln agent --job-user NAME)", map[string]string{UsersPerLease: "lease", UsersPerKilnUser: "kiln user"}[sb.Users])
		}
		if sb.FirstUID == 0 || sb.LastUID < sb.FirstUID {
			return fmt.Errorf("process executor: job uids %d-%d: want a range above 0", sb.FirstUID, sb.LastUID)
		}
		if me := uint32(os.Getuid()); me >= sb.FirstUID && me <= sb.LastUID {
			return fmt.Errorf("process executor: job uids %d-%d hold the agent's own uid %d", sb.FirstUID, sb.LastUID, me)
		}
	case UsersFixed:
		id, err := lookupUser(sb.User, sb.Groups)
		if err != nil {
			return err
		}
		if id.uid == 0 {
			return fmt.Errorf("process executor: jobs may not run as root (--job-user %s)", sb.User)
		}
		if id.uid == uint32(os.Getuid()) && os.Geteuid() == 0 {
			return fmt.Errorf("process executor: jobs may not run as the agent's user")
		}
		if id.uid != uint32(os.Getuid()) && os.Geteuid() != 0 {
			return fmt.Errorf("process executor: running jobs as %s needs root (the agent runs as uid %d)", sb.User, os.Getuid())
		}
	default:
		return fmt.Errorf("process executor: job users %q: want %s, %s or %s", sb.Users, UsersPerLease, UsersPerKilnUser, UsersFixed)
	}
	return nil
}

// lookupUser finds a user by name or uid, with its primary group and the
// supplementary groups given.
func lookupUser(name string, groups []string) (identity, error) {
	var u *user.User
	var err error
	if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
		u, err = user.LookupId(name)
		if err != nil {
			n, _ := strconv.ParseUint(name, 10, 32)
			id := identity{uid: uint32(n), gid: uint32(n), name: "uid " + name}
			id.groups, err = lookupGroups(groups)
			return id, err
		}
	} else {
		u, err = user.Lookup(name)
	}
	if err != nil {
		return identity{}, fmt.Errorf("process executor: job user %s: %w", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	id := identity{uid: uint32(uid), gid: uint32(gid), name: fmt.Sprintf("uid %d (%s)", uid, u.Username)}
	id.groups, err = lookupGroups(groups)
	return id, err
}

func lookupGroups(names []string) ([]uint32, error) {
	var out []uint32
	for _, g := range names {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			out = append(out, uint32(n))
			continue
		}
		gr, err := user.LookupGroup(g)
		if err != nil {
			return nil, fmt.Errorf("process executor: job group %s: %w", g, err)
		}
		n, _ := strconv.ParseUint(gr.Gid, 10, 32)
		out = append(out, uint32(n))
	}
	return out, nil
}

// usersFile keeps the per-user uids across runs of the agent.
func (e *Executor) usersFile() string {
	if e.StateDir == "" {
		return ""
	}
	return filepath.Join(e.StateDir, "uids.json")
}

// acquire gives the job its identity; release gives it back when the job
// ends.
func (e *Executor) acquire(lease, kilnUser string) (identity, error) {
	sb := e.sandboxDefaults()
	groups, err := lookupGroups(sb.Groups)
	if err != nil {
		return identity{}, err
	}
	if sb.Users == UsersFixed {
		return lookupUser(sb.User, sb.Groups)
	}
	u := &jobUsers
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byLease == nil {
		u.byLease, u.jobs, u.byUser, u.inUse = map[string]uint32{}, map[string]int{}, map[string]uint32{}, map[uint32]bool{}
	}
	if sb.Users == UsersPerKilnUser {
		if !u.loaded {
			u.loaded = true
			if p := e.usersFile(); p != "" {
				if b, err := os.ReadFile(p); err == nil {
					_ = json.Unmarshal(b, &u.byUser)
				}
			}
			for _, uid := range u.byUser {
				u.inUse[uid] = true
			}
		}
		if kilnUser == "" {
			return identity{}, errors.New("process executor: the job names no kiln user (KILN_USER) to give a uid")
		}
		uid, ok := u.byUser[kilnUser]
		if !ok {
			if uid, err = u.free(sb); err != nil {
				return identity{}, err
			}
			u.byUser[kilnUser], u.inUse[uid] = uid, true
			if p := e.usersFile(); p != "" {
				b, _ := json.Marshal(u.byUser)
				if err := writeFileAtomic(p, b); err != nil {
					return identity{}, fmt.Errorf("process executor: keeping the uid of %s: %w", kilnUser, err)
				}
			}
		}
		return identity{uid: uid, gid: uid, groups: groups, name: fmt.Sprintf("uid %d (kiln user %s)", uid, kilnUser)}, nil
	}
	key := lease
	if key == "" {
		key = "job"
	}
	uid, ok := u.byLease[key]
	if !ok {
		if uid, err = u.free(sb); err != nil {
			return identity{}, err
		}
		u.byLease[key], u.inUse[uid] = uid, true
	}
	u.jobs[key]++
	return identity{uid: uid, gid: uid, groups: groups, name: fmt.Sprintf("uid %d (lease %s)", uid, lease)}, nil
}

// free finds a uid of the range nobody uses: not handed out, not in the
// user database, owning no process; u.mu is held.
func (u *users) free(sb *Sandbox) (uint32, error) {
	busy := uidsOfProcesses()
	for uid := sb.FirstUID; uid <= sb.LastUID && uid >= sb.FirstUID; uid++ {
		if u.inUse[uid] || busy[uid] {
			continue
		}
		if _, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			continue
		}
		return uid, nil
	}
	return 0, fmt.Errorf("process executor: every job uid from %d to %d is in use", sb.FirstUID, sb.LastUID)
}

// release ends a job's hold on its identity: the last job of a lease gives
// the uid back, once every process left under it is killed.
func (e *Executor) release(lease string, id identity) {
	sb := e.sandboxDefaults()
	if sb.Users != UsersPerLease {
		return
	}
	u := &jobUsers
	u.mu.Lock()
	defer u.mu.Unlock()
	key := lease
	if key == "" {
		key = "job"
	}
	if u.jobs[key]--; u.jobs[key] > 0 {
		return
	}
	killUID(id.uid)
	delete(u.jobs, key)
	delete(u.byLease, key)
	delete(u.inUse, id.uid)
}

// uidsOfProcesses are the real uids of the processes running now.
func uidsOfProcesses() map[uint32]bool {
	out := map[uint32]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		if uid, ok := procUID(ent.Name()); ok {
			out[uid] = true
		}
	}
	return out
}

func procUID(pid string) (uint32, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, err := strconv.ParseUint(f[0], 10, 32)
				return uint32(n), err == nil
			}
		}
	}
	return 0, false
}

// killUID kills every process whose real uid is uid: what a job left
// running outside its process group before its uid serves another lease.
func killUID(uid uint32) {
	if uid == 0 || int(uid) == os.Getuid() {
		return
	}
	for i := 0; i < 10; i++ {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil {
				continue
			}
			if u, ok := procUID(ent.Name()); ok && u == uid {
				found = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if !found {
			return
		}
	}
}

// workDir makes the job's private directory (0700, the job's) and its tmp
// (DIR.tmp, the same) under the work root, which it checks first: owned by the agent, not
// a link, enterable by others.
func (e *Executor) workDir(job string, id identity) (string, error) {
	root := e.sandboxDefaults().WorkRoot
	if err := os.MkdirAll(root, 0o711); err != nil {
		return "", fmt.Errorf("job directory root %s: %w", root, err)
	}
	st, err := os.Lstat(root)
	if err != nil {
		return "", err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || sys == nil || sys.Uid != uint32(os.Geteuid()) {
		return "", fmt.Errorf("job directory root %s is not a directory the agent owns: refusing to put jobs there", root)
	}
	if st.Mode().Perm() != 0o711 {
		if err := os.Chmod(root, 0o711); err != nil {
			return "", err
		}
	}
	for p := filepath.Dir(root); ; p = filepath.Dir(p) {
		if pst, err := os.Stat(p); err == nil && pst.Mode().Perm()&0o001 == 0 {
			return "", fmt.Errorf("job directory root %s: %s (mode %v) may not be entered by job users", root, p, pst.Mode().Perm())
		}
		if p == "/" || p == "." {
			break
		}
	}
	dir := filepath.Join(root, filepath.Base(job))
	_ = os.RemoveAll(dir) // left by a crash
	_ = os.RemoveAll(dir + ".tmp")
	for _, d := range []string{dir, dir + ".tmp"} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", err
		}
		if err := os.Chown(d, int(id.uid), int(id.gid)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// deviceNodes are the GPU device nodes of the machine a job must not
// reach: those of GPUs not in allowed (PCI addresses). NVIDIA's are
// /dev/nvidiaN by the GPU's device minor, AMD's and Intel's the DRM nodes
// by the PCI device they belong to.
func deviceNodes(allowed map[string]bool) []string {
	var out []string
	if ents, err := os.ReadDir("/proc/driver/nvidia/gpus"); err == nil {
		for _, e := range ents {
			pci := strings.ToLower(e.Name())
			b, err := os.ReadFile(filepath.Join("/proc/driver/nvidia/gpus", e.Name(), "information"))
			if err != nil || allowed[pci] {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if rest, ok := strings.CutPrefix(line, "Device Minor:"); ok {
					if p := "/dev/nvidia" + strings.TrimSpace(rest); exists(p) {
						out = append(out, p)
					}
				}
			}
		}
	}
	if ents, err := os.ReadDir("/sys/class/drm"); err == nil {
		for _, e := range ents {
			name := e.Name()
			if !strings.HasPrefix(name, "renderD") && (!strings.HasPrefix(name, "card") || strings.Contains(name, "-")) {
				continue
			}
			dev, err := filepath.EvalSymlinks(filepath.Join("/sys/class/drm", name, "device"))
			if err != nil || allowed[strings.ToLower(filepath.Base(dev))] {
				continue
			}
			if p := "/dev/dri/" + name; exists(p) {
				out = append(out, p)
			}
		}
	}
	sort.Strings(out)
	return out
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func writeFileAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
