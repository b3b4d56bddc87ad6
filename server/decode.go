package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/serving"
)

// Body limits.
const (
	maxBody         = 1 << 20  // requests
	maxSnapshotBody = 16 << 20 // an agent's snapshot
	maxLogChunk     = 1 << 20  // one chunk of job output
	maxUnauthBody   = 64 << 10 // a request without credentials (join)
)

// Bounds of durations given in seconds: each is far below what a
// time.Duration holds (292 years), so adding one to a time never overflows.
const (
	maxTokenTTL   = 10 * 365 * 24 * 3600 // an API token: ten years
	maxJoinTTL    = 365 * 24 * 3600      // a join token: one year
	maxPeriod     = 10 * 365 * 24 * 3600 // a project's quota period: ten years
	maxTimeLimitS = 365 * 24 * 3600      // a lease's time limit: one year
)

// errTooLarge is answered with 413.
var errTooLarge = errors.New("request body too large")

// decodeJSON reads exactly one JSON value with no unknown field.
func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty body: want a JSON object")
		}
		return fmt.Errorf("request body: %w", err)
	}
	if dec.More() {
		return errors.New("request body: more than one JSON value")
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("request body: trailing data after the JSON value")
	}
	return nil
}

// readRequest reads a request's body (at most limit bytes) and parses it;
// on bad or oversized input it answers 400 or 413 and returns false.
func readRequest[T any](w http.ResponseWriter, r *http.Request, limit int64, parse func([]byte) (T, error)) (T, bool) {
	body, err := readBody(r, limit)
	if err == nil {
		v, perr := parse(body)
		if perr == nil {
			return v, true
		}
		err = perr
	}
	writeErr(w, 0, badRequest(err))
	var zero T
	return zero, false
}

// readBody reads at most limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if ra, ok := r.Body.(*readBodyAhead); ok && ra.Len() == len(ra.b) {
		// Read before the handler ran (readBodyFirst): the bytes as they are.
		if int64(len(ra.b)) > limit {
			return nil, errTooLarge
		}
		ra.Reset(nil)
		return ra.b, nil
	}
	b, err := readAllSized(r.Body, r.ContentLength, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the request: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}

// readBodyAhead is a request body read whole before its handler ran.
type readBodyAhead struct {
	*bytes.Reader
	b []byte
}

func (*readBodyAhead) Close() error { return nil }

// readAllSized reads up to limit+1 bytes of body (one more than allowed, so
// that the caller sees it is too long), into a buffer of the size the
// request declared when it declared one within the limit.
func readAllSized(body io.Reader, declared, limit int64) ([]byte, error) {
	if declared <= 0 || declared > limit {
		return io.ReadAll(io.LimitReader(body, limit+1))
	}
	b := make([]byte, declared, declared+1)
	if _, err := io.ReadFull(body, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("the body ended before the %d bytes its length says: %w", declared, err)
		}
		return nil, err
	}
	// A body longer than it said (HTTP/2 refuses that itself; a test's
	// reader may not): read on, within the limit.
	var one [1]byte
	n, err := io.ReadFull(body, one[:])
	if n == 0 {
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		return nil, err
	}
	rest, err := io.ReadAll(io.LimitReader(body, limit-declared))
	if err != nil {
		return nil, err
	}
	return append(append(b, one[0]), rest...), nil
}

// The checks below are plain loops, not regular expressions: bounded
// repetitions such as {0,127} compile to large programs, which every kiln
// command paid for at start (2,400 allocations).

// validName: a project, user or node name: 1-63 characters, lowercase
// letters, digits, '.', '_' or '-', the first a letter or digit.
func validName(s string) bool {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	return validWord(s, 63, alnum, func(c byte) bool { return alnum(c) || c == '.' || c == '_' || c == '-' })
}

// validEnvKey: an environment variable name: 1-128 characters, letters,
// digits and '_', not starting with a digit.
func validEnvKey(s string) bool {
	letter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' }
	return validWord(s, 128, letter, func(c byte) bool { return letter(c) || c >= '0' && c <= '9' })
}

// validWord: 1 to max bytes, the first one that first accepts, the others
// ones that rest accepts.
func validWord(s string, max int, first, rest func(byte) bool) bool {
	if len(s) == 0 || len(s) > max || !first(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !rest(s[i]) {
			return false
		}
	}
	return true
}

// validVersion: one to four dot-separated numbers of one to five digits
// ("12", "12.2", "535.183.01").
func validVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		if len(p) == 0 || len(p) > 5 {
			return false
		}
		for i := 0; i < len(p); i++ {
			if p[i] < '0' || p[i] > '9' {
				return false
			}
		}
	}
	return true
}

// parseLeaseRequest decodes and checks a lease request.
func parseLeaseRequest(b []byte) (api.LeaseRequest, error) {
	var r api.LeaseRequest
	if err := decodeJSON(b, &r); err != nil {
		return r, err
	}
	return r, checkLeaseRequest(&r)
}

func checkLeaseRequest(r *api.LeaseRequest) error {
	if r.Project != "" && !validName(r.Project) {
		return fmt.Errorf("project %q: want lowercase letters, digits, '.', '_' or '-'", trunc(r.Project))
	}
	if len(r.Name) > 128 {
		return errors.New("name: at most 128 characters")
	}
	kinds := 0
	if r.GPUs != 0 {
		kinds++
		if r.GPUs < 0 || r.GPUs > 4096 {
			return fmt.Errorf("gpus %d: want 1 to 4096", r.GPUs)
		}
	}
	if r.Fraction != 0 {
		kinds++
		if !finite(r.Fraction) || r.Fraction <= 0 || r.Fraction >= 1 {
			return fmt.Errorf("fraction %v: want more than 0 and less than 1 (ask for whole GPUs with gpus)", r.Fraction)
		}
		if r.Fraction < 0.001 {
			return fmt.Errorf("fraction %v: the smallest share is 0.001", r.Fraction)
		}
	}
	if r.MIG != "" {
		kinds++
		// "/" only in a MIG device name such as MIG-GPU-<uuid>/3/0.
		if len(r.MIG) > 128 || strings.ContainsAny(r.MIG, " \t\n") || (strings.Contains(r.MIG, "/") && !strings.HasPrefix(strings.ToUpper(r.MIG), "MIG-")) {
			return fmt.Errorf("mig %q: want a profile such as 1g.10gb or a MIG device UUID", trunc(r.MIG))
		}
	}
	if kinds != 1 {
		return errors.New("ask for exactly one of: gpus (whole GPUs), fraction (a share of one GPU), mig (a MIG instance)")
	}
	if r.MemoryBytes != 0 && r.Fraction == 0 {
		return errors.New("memory_bytes is for a fraction; for whole GPUs use constraints.min_memory_bytes")
	}
	if r.TimeLimitSeconds < 0 || r.TimeLimitSeconds > maxTimeLimitS {
		return fmt.Errorf("time_limit_s %d: want 0 (the default) to %d (one year)", r.TimeLimitSeconds, maxTimeLimitS)
	}
	if r.Priority < -1000 || r.Priority > 1000 {
		return fmt.Errorf("priority %d: want -1000 to 1000", r.Priority)
	}
	c := &r.Constraints
	for k, v := range map[string]string{"min_compute_capability": c.MinComputeCapability, "min_driver": c.MinDriver, "min_cuda": c.MinCUDA} {
		if v != "" && !validVersion(v) {
			return fmt.Errorf("constraints.%s %q: want a version such as 12.2", k, trunc(v))
		}
	}
	for k, v := range map[string]string{"vendor": c.Vendor, "model": c.Model, "architecture": c.Architecture} {
		if len(v) > 128 {
			return fmt.Errorf("constraints.%s: at most 128 characters", k)
		}
	}
	if c.Vendor != "" && c.Vendor != "nvidia" && c.Vendor != "amd" && c.Vendor != "intel" {
		return fmt.Errorf("constraints.vendor %q: want nvidia, amd or intel", trunc(c.Vendor))
	}
	if len(c.Nodes) > 1024 {
		return errors.New("constraints.nodes: at most 1024 nodes")
	}
	if c.Gang && r.GPUs < 2 {
		return errors.New("constraints.gang spreads whole GPUs over nodes: ask for 2 or more")
	}
	if r.Job != nil {
		if err := checkJobSpec(r.Job); err != nil {
			return err
		}
	}
	if len(r.Require) > 5 {
		return errors.New("require: at most 5 items")
	}
	for _, q := range r.Require {
		switch q {
		case api.SandboxOwnUser, api.SandboxPIDNamespace, api.SandboxMountNamespace, api.SandboxCgroup, api.SandboxDevices:
		default:
			return fmt.Errorf("require %q: want %s, %s, %s, %s or %s", trunc(q), api.SandboxOwnUser, api.SandboxPIDNamespace, api.SandboxMountNamespace, api.SandboxCgroup, api.SandboxDevices)
		}
	}
	if len(r.Require) > 0 && r.Job != nil && r.Job.Image != "" {
		return errors.New("require is what a job run as a process gets; a job with an image runs in a container")
	}
	if r.Resources.CPUMilli < 0 || r.Resources.CPUMilli > 1<<20 || r.Resources.MemoryBytes > 1<<50 {
		return errors.New("resources: cpu_milli 0 to 1048576, memory_bytes at most 2^50")
	}
	if r.Serve != nil {
		if err := checkServeSpec(r); err != nil {
			return err
		}
	}
	return checkPlacement(r)
}

// checkServeSpec checks a deployment's lease: its engine is the lease's
// job, listening on a port it declares.
func checkServeSpec(r *api.LeaseRequest) error {
	sv := r.Serve
	if err := serving.CheckName(sv.Model); err != nil {
		return fmt.Errorf("serve.model: %w", err)
	}
	if r.Job == nil || !slices.Contains(r.Job.Ports, sv.Port) {
		return fmt.Errorf("serve.port %d: the lease's job must declare the engine's port (job.ports)", sv.Port)
	}
	if err := checkReadyPath(sv.Ready); err != nil {
		return fmt.Errorf("serve.ready: %w", err)
	}
	if len(sv.Engine) > 64 || !printableLine(sv.Engine) {
		return errors.New("serve.engine: at most 64 printable characters")
	}
	if len(sv.Source) > 4096 || !printableLine(sv.Source) {
		return errors.New("serve.source: at most 4096 printable characters")
	}
	return nil
}

// checkReadyPath: an engine's readiness path, asked of it by the server.
func checkReadyPath(p string) error {
	if !strings.HasPrefix(p, "/") || len(p) > 256 || !printableLine(p) || strings.ContainsAny(p, " #") || strings.Contains(p, "..") {
		return fmt.Errorf("%q: want a path such as /health", trunc(p))
	}
	return nil
}

// validDigest: sha256: and 64 lowercase hex digits.
func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// printableLine: no control characters, valid UTF-8.
func printableLine(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

func parseServeChoose(b []byte) (api.ServeChooseRequest, error) {
	var r api.ServeChooseRequest
	if err := decodeJSON(b, &r); err != nil {
		return r, err
	}
	return r, checkServeChoose(&r)
}

func checkServeChoose(r *api.ServeChooseRequest) error {
	m := &r.Model
	if err := serving.CheckName(m.Name); err != nil {
		return fmt.Errorf("model.name: %w", err)
	}
	if m.Format != serving.FormatSafetensors && m.Format != serving.FormatGGUF {
		return fmt.Errorf("model.format %q: want %s or %s", trunc(m.Format), serving.FormatSafetensors, serving.FormatGGUF)
	}
	if len(m.Precision) > 16 || !printableLine(m.Precision) {
		return errors.New("model.precision: at most 16 printable characters")
	}
	if m.WeightsBytes < 0 || m.WeightsBytes > 1<<50 {
		return fmt.Errorf("model.weights_bytes %d: want 0 to 2^50", m.WeightsBytes)
	}
	if (m.Path == "") == (m.Ref == "") {
		return errors.New("model: give its path (as the nodes see it) or its ref (a model of the lab's registry), one of them")
	}
	if m.Ref != "" {
		at := strings.LastIndex(m.Ref, "@")
		if at < 0 || !validDigest(m.Ref[at+1:]) || len(m.Ref) > 512 || strings.ContainsAny(m.Ref, " \t\n\x00") || !printableLine(m.Ref) {
			return fmt.Errorf("model.ref %q: want REGISTRY/REPOSITORY@sha256:... (kiln model inspect gives it)", trunc(m.Ref))
		}
		if m.File != "" && (strings.HasPrefix(m.File, "/") || strings.Contains(m.File, "..") || len(m.File) > 1024 || !printableLine(m.File)) {
			return fmt.Errorf("model.file %q: want a path inside the model", trunc(m.File))
		}
	} else {
		for k, p := range map[string]string{"model.path": m.Path, "model.file": m.File} {
			if (p != "" || k == "model.path") && (!strings.HasPrefix(p, "/") || len(p) > 4096 || !printableLine(p)) {
				return fmt.Errorf("%s %q: want an absolute path as the nodes see it", k, trunc(p))
			}
		}
	}
	if sh := m.Shape; sh != nil {
		for k, v := range map[string]int{"layers": sh.Layers, "encoder_layers": sh.EncoderLayers, "hidden": sh.Hidden, "heads": sh.Heads,
			"kv_heads": sh.KVHeads, "head_dim": sh.HeadDim, "ffn": sh.FFN, "vocab": sh.Vocab, "seq": sh.Seq, "max_seq": sh.MaxSeq,
			"experts": sh.Experts, "experts_per_token": sh.ExpertsPerToken} {
			if v < 0 || v > 1<<24 {
				return fmt.Errorf("model.shape.%s %d: want 0 to 2^24", k, v)
			}
		}
		if !finite(sh.Params) || sh.Params < 0 || sh.Params > 1e15 {
			return errors.New("model.shape.params: want 0 to 1e15")
		}
	}
	if len(r.Engine) > 64 || !printableLine(r.Engine) {
		return errors.New("engine: at most 64 printable characters")
	}
	if len(r.Image) > 512 || strings.ContainsAny(r.Image, " \t\n\x00") || !printableLine(r.Image) {
		return fmt.Errorf("image %q: not an image reference", trunc(r.Image))
	}
	if len(r.Command) > 256 {
		return errors.New("command: at most 256 arguments")
	}
	for _, a := range r.Command {
		if strings.ContainsRune(a, 0) || len(a) > 4096 {
			return errors.New("command: an argument holds a NUL byte or is over 4096 bytes")
		}
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("port %d: want 1 to 65535", r.Port)
	}
	if r.Ready != "" {
		if err := checkReadyPath(r.Ready); err != nil {
			return fmt.Errorf("ready: %w", err)
		}
	}
	if r.Context < 0 || r.Context > 1<<24 || r.Batch < 0 || r.Batch > 1<<16 || r.GPUs < 0 || r.GPUs > 4096 {
		return errors.New("context (0 to 2^24), batch (0 to 65536) and gpus (0 to 4096) are out of range")
	}
	return nil
}

// checkPlacement checks who is to pick the lease's devices.
func checkPlacement(r *api.LeaseRequest) error {
	switch r.Placement {
	case "", api.PlacementKiln:
		return nil
	case api.PlacementScheduler:
	default:
		return fmt.Errorf("placement %q: want %s (kiln picks the devices, the default) or %s (the kube-scheduler picks among those kiln offers)",
			trunc(r.Placement), api.PlacementKiln, api.PlacementScheduler)
	}
	c := r.Constraints
	switch {
	case r.GPUs == 0:
		return errors.New("placement scheduler is for whole GPUs (gpus); kiln places fractions and MIG instances itself")
	case c.Gang:
		return errors.New("placement scheduler picks devices on one node; a gang spread over nodes is placed by kiln")
	case c.SameNVLinkIsland || c.SameNUMA:
		return errors.New("placement scheduler cannot keep GPUs in one NVLink island or NUMA node; leave those to kiln (placement kiln)")
	case r.Job == nil || r.Job.Image == "":
		return errors.New("placement scheduler needs the lease's job with an image (kiln run --image ... --placement scheduler): the kube-scheduler picks the devices when the job's Pod is scheduled")
	}
	return nil
}

func checkJobSpec(j *api.JobSpec) error {
	if len(j.Command) == 0 && j.Image == "" {
		return errors.New("job: give a command, an image, or both")
	}
	if len(j.Command) > 4096 {
		return errors.New("job.command: at most 4096 arguments")
	}
	for _, a := range j.Command {
		if strings.ContainsRune(a, 0) {
			return errors.New("job.command: an argument holds a NUL byte")
		}
	}
	if len(j.Command) > 0 && j.Command[0] == "" {
		return errors.New("job.command: the program is empty")
	}
	if len(j.Image) > 512 || strings.ContainsAny(j.Image, " \t\n\x00") {
		return fmt.Errorf("job.image %q: not an image reference", trunc(j.Image))
	}
	if len(j.Env) > 1024 {
		return errors.New("job.env: at most 1024 variables")
	}
	for k, v := range j.Env {
		if !validEnvKey(k) {
			return fmt.Errorf("job.env: %q is not a variable name", trunc(k))
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("job.env %s: the value holds a NUL byte", k)
		}
	}
	if strings.ContainsRune(j.WorkDir, 0) || len(j.WorkDir) > 4096 {
		return errors.New("job.workdir: not a path")
	}
	if m := j.Model; m != nil {
		if m.Ref == "" || len(m.Ref) > 512 || strings.ContainsAny(m.Ref, " \t\n\x00") || !printableLine(m.Ref) {
			return fmt.Errorf("job.model.ref %q: not a model reference", trunc(m.Ref))
		}
		if !validDigest(m.Digest) {
			return fmt.Errorf("job.model.digest %q: want sha256: and 64 hex digits", trunc(m.Digest))
		}
	}
	return checkPorts(j.Ports)
}

// maxPorts is the most ports a job may declare.
const maxPorts = 16

func checkPorts(ports []int) error {
	if len(ports) > maxPorts {
		return fmt.Errorf("job.ports: at most %d ports", maxPorts)
	}
	for i, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("job.ports: %d is not a TCP port (1 to 65535)", p)
		}
		if slices.Contains(ports[:i], p) {
			return fmt.Errorf("job.ports: %d is given twice", p)
		}
	}
	return nil
}

// finite reports whether f is a number: not NaN, not an infinity (NaN
// fails every comparison, so a range check alone lets it through).
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// queryFloat reads a query parameter as a number in [lo, hi]; def when
// absent.
func queryFloat(r *http.Request, name string, lo, hi, def float64) (float64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !finite(f) || f < lo || f > hi {
		return 0, &httpError{http.StatusBadRequest, fmt.Errorf("%s=%s: want a number from %g to %g", name, trunc(v), lo, hi)}
	}
	return f, nil
}

// queryInt reads a query parameter as an integer in [lo, hi]; def when
// absent.
func queryInt(r *http.Request, name string, lo, hi, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, &httpError{http.StatusBadRequest, fmt.Errorf("%s=%s: want an integer from %d to %d", name, trunc(v), lo, hi)}
	}
	return n, nil
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// parseTokenRequest decodes and checks a token request.
func parseTokenRequest(b []byte) (api.TokenRequest, error) {
	var r api.TokenRequest
	if err := decodeJSON(b, &r); err != nil {
		return r, err
	}
	if r.User != "" && !validName(r.User) {
		return r, fmt.Errorf("user %q: want lowercase letters, digits, '.', '_' or '-'", trunc(r.User))
	}
	if r.Role != "" && r.Role != api.RoleAdmin && r.Role != api.RoleMember {
		return r, fmt.Errorf("role %q: want admin or member", trunc(r.Role))
	}
	for _, p := range r.Projects {
		if !validName(p) {
			return r, fmt.Errorf("project %q: want lowercase letters, digits, '.', '_' or '-'", trunc(p))
		}
	}
	if len(r.Projects) > 256 || len(r.Name) > 128 {
		return r, errors.New("too many projects or name too long")
	}
	if r.TTLSeconds < 0 || r.TTLSeconds > maxTokenTTL {
		return r, fmt.Errorf("ttl_s %d: want 0 (no expiry) to %d (ten years)", r.TTLSeconds, maxTokenTTL)
	}
	return r, nil
}

// parseProject decodes and checks a project.
func parseProject(b []byte) (api.Project, error) {
	var p api.Project
	if err := decodeJSON(b, &p); err != nil {
		return p, err
	}
	if !validName(p.Name) {
		return p, fmt.Errorf("name %q: want lowercase letters, digits, '.', '_' or '-'", trunc(p.Name))
	}
	// What the server counts is not the caller's to set: read-only in the
	// API, answered by GET.
	p.HeldGPUs, p.UsedHours, p.QueuedLease = 0, 0, 0
	for _, f := range []struct {
		name     string
		v, limit float64
	}{{"weight", p.Weight, 1e6}, {"max_gpus", p.MaxGPUs, 1e6}, {"gpu_hours", p.GPUHours, 1e12}} {
		if !finite(f.v) || f.v < 0 || f.v > f.limit {
			return p, fmt.Errorf("%s %v: want 0 to %g", f.name, f.v, f.limit)
		}
	}
	if p.PeriodSeconds < 0 || p.PeriodSeconds > maxPeriod {
		return p, fmt.Errorf("period_s %d: want 0 (30 days) to %d (ten years)", p.PeriodSeconds, maxPeriod)
	}
	l := p.Limits
	for _, f := range []struct {
		name     string
		v, limit int64
	}{{"max_queued", int64(l.MaxQueued), 1e6}, {"max_queued_per_user", int64(l.MaxQueuedPerUser), 1e6}, {"max_jobs_per_lease", int64(l.MaxJobsPerLease), 1e6},
		{"max_env_bytes", int64(l.MaxEnvBytes), 1 << 30}, {"max_log_bytes_per_job", l.MaxLogBytesPerJob, 1 << 50}, {"max_log_bytes", l.MaxLogBytes, 1 << 50}} {
		if f.v < 0 || f.v > f.limit {
			return p, fmt.Errorf("limits.%s %d: want 0 (the server's default) to %d", f.name, f.v, f.limit)
		}
	}
	return p, nil
}

// parseDrain decodes and checks a drain request.
func parseDrain(b []byte) (api.DrainRequest, error) {
	var d api.DrainRequest
	if err := decodeJSON(b, &d); err != nil {
		return d, err
	}
	if len(d.Devices) > 4096 || len(d.Reason) > 1024 {
		return d, errors.New("too many devices or reason too long")
	}
	return d, nil
}

// parseJoin decodes and checks an agent's join request.
func parseJoin(b []byte) (api.JoinRequest, error) {
	var j api.JoinRequest
	if err := decodeJSON(b, &j); err != nil {
		return j, err
	}
	if !validName(j.Node) {
		return j, fmt.Errorf("node %q: want lowercase letters, digits, '.', '_' or '-' (at most 63)", trunc(j.Node))
	}
	if j.Token == "" || j.CSRPEM == "" {
		return j, errors.New("token and csr_pem are required")
	}
	return j, nil
}

// parseHeartbeat decodes and checks a heartbeat.
func parseHeartbeat(b []byte) (api.Heartbeat, error) {
	var h api.Heartbeat
	if err := decodeJSON(b, &h); err != nil {
		return h, err
	}
	if len(h.Running) > 100000 || h.WaitMS < 0 || h.WaitMS > 600000 {
		return h, errors.New("running: at most 100000 jobs; wait_ms: 0 to 600000")
	}
	if len(h.Open) > len(h.Running) {
		return h, errors.New("open: ports of running jobs only")
	}
	for job, ports := range h.Open {
		if err := checkPorts(ports); err != nil {
			return h, fmt.Errorf("open %s: %w", trunc(job), err)
		}
	}
	if len(h.Chosen) > len(h.Running) {
		return h, errors.New("chosen: devices of running jobs only")
	}
	for job, ids := range h.Chosen {
		if len(ids) == 0 || len(ids) > 4096 {
			return h, fmt.Errorf("chosen %s: 1 to 4096 devices", trunc(job))
		}
		for _, id := range ids {
			if id == "" || len(id) > 256 {
				return h, fmt.Errorf("chosen %s: a device ID of 1 to 256 characters", trunc(job))
			}
		}
	}
	if err := checkSamples(h.Samples); err != nil {
		return h, err
	}
	return h, nil
}

// checkSamples holds a heartbeat's GPU readings to what a GPU can read.
func checkSamples(ss []api.GPUSample) error {
	if len(ss) > maxNodeGPUs {
		return fmt.Errorf("samples: at most %d GPUs", maxNodeGPUs)
	}
	in := func(v *float64, lo, hi float64) bool { return v == nil || (*v >= lo && *v <= hi) }
	seen := map[int]bool{}
	for _, x := range ss {
		if x.GPU < 0 || x.GPU >= maxNodeGPUs || seen[x.GPU] {
			return fmt.Errorf("samples: GPU index %d out of range or twice", x.GPU)
		}
		seen[x.GPU] = true
		// NaN fails every comparison, so it is refused too.
		if x.Processes != nil && (*x.Processes < 0 || *x.Processes > maxGPUProcesses) {
			return fmt.Errorf("samples: GPU %d: 0 to %d processes", x.GPU, maxGPUProcesses)
		}
		if !in(x.Utilization, 0, 100) || !in(x.PowerW, 0, 100000) || !in(x.TemperatureC, -273, 1000) {
			return fmt.Errorf("samples: GPU %d: utilization 0 to 100 %%, power 0 to 100 kW, temperature -273 to 1000 °C", x.GPU)
		}
	}
	return nil
}

// parseRegister decodes and checks an agent's snapshot.
func parseRegister(b []byte) (api.RegisterRequest, error) {
	var r api.RegisterRequest
	// Snapshots come from newer agents too: unknown fields are kept out,
	// not refused.
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("request body: %w", err)
	}
	if r.Snapshot == nil {
		return r, errors.New("snapshot: required")
	}
	return r, plausible(&r)
}

// Bounds of what a node's snapshot may claim. The largest machines have 16
// GPUs and under 300 GB per GPU; the bounds leave room, and keep an agent
// (or a job that stole its key) from claiming GPUs a real node cannot have.
const (
	maxNodeGPUs      = 256
	maxGPUMemory     = 4 << 40 // bytes
	maxSnapshotText  = 256     // a model, a driver version, a UUID
	maxNodeRunning   = 100000
	maxNodeFindings  = 10000
	maxGPUProcesses  = 4096
	maxMIGPerGPU     = 64
	maxHostnameBytes = 253
)

// plausible checks a node's snapshot: counts and sizes within bounds, no
// GPU twice (by PCI address or UUID), text fields short and printable.
func plausible(r *api.RegisterRequest) error {
	s := r.Snapshot
	if len(s.GPUs) > maxNodeGPUs {
		return fmt.Errorf("snapshot: %d GPUs; a node has at most %d", len(s.GPUs), maxNodeGPUs)
	}
	if len(r.Running) > maxNodeRunning || len(r.Findings) > maxNodeFindings {
		return fmt.Errorf("snapshot: %d running jobs and %d findings; at most %d and %d", len(r.Running), len(r.Findings), maxNodeRunning, maxNodeFindings)
	}
	if !shortText(s.Host.Hostname, maxHostnameBytes) {
		return errors.New("snapshot: the host name is longer than 253 bytes or holds control characters")
	}
	pci, uuid := map[string]bool{}, map[string]bool{}
	for _, g := range s.GPUs {
		if g.Index < 0 || g.Index > 1<<20 {
			return fmt.Errorf("snapshot: GPU index %d out of range", g.Index)
		}
		if g.MemoryTotalBytes > maxGPUMemory || g.MemoryUsedBytes > maxGPUMemory {
			return fmt.Errorf("snapshot: GPU %d claims %d bytes of memory; at most %d", g.Index, g.MemoryTotalBytes, uint64(maxGPUMemory))
		}
		for _, t := range []string{g.Model, g.UUID, g.PCIAddress, g.Vendor, g.Architecture, g.ComputeCapability, g.GFXTarget} {
			if !shortText(t, maxSnapshotText) {
				return fmt.Errorf("snapshot: GPU %d: a name longer than %d bytes or with control characters", g.Index, maxSnapshotText)
			}
		}
		if g.PCIAddress != "" {
			if pci[g.PCIAddress] {
				return fmt.Errorf("snapshot: PCI address %s twice", g.PCIAddress)
			}
			pci[g.PCIAddress] = true
		}
		if g.UUID != "" {
			if uuid[g.UUID] {
				return fmt.Errorf("snapshot: GPU UUID %s twice", g.UUID)
			}
			uuid[g.UUID] = true
		}
		if g.MIG != nil && len(g.MIG.Instances) > maxMIGPerGPU {
			return fmt.Errorf("snapshot: more than %d MIG instances on a GPU", maxMIGPerGPU)
		}
		if len(g.ProcessList) > maxGPUProcesses {
			return fmt.Errorf("snapshot: more than %d processes on a GPU", maxGPUProcesses)
		}
	}
	for _, f := range r.Findings {
		if len(f.ID) > maxSnapshotText || len(f.Title) > 4096 || len(f.Remedy) > 4096 || len(f.Devices) > maxNodeGPUs {
			return errors.New("snapshot: a finding too large")
		}
	}
	for _, t := range []string{s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel, s.Drivers.AMDGPU, s.Drivers.CUDADriver, r.Executor, r.Containers} {
		if !shortText(t, maxSnapshotText) {
			return errors.New("snapshot: a driver or executor name longer than 256 bytes or with control characters")
		}
	}
	if len(r.NoContainers) > 4096 {
		return errors.New("snapshot: no_containers longer than 4096 bytes")
	}
	return nil
}

// shortText: at most max bytes, no control character.
func shortText(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// parseExit decodes an exit report.
func parseExit(b []byte) (api.ExitReport, error) {
	var e api.ExitReport
	if err := decodeJSON(b, &e); err != nil {
		return e, err
	}
	if len(e.Reason) > 4096 || len(e.Signal) > 64 {
		return e, errors.New("reason or signal too long")
	}
	if u := e.GPU; u != nil {
		// 256 GPUs of a few TB each at most; SM use summed over them.
		if u.Samples < 0 || u.SampleSeconds < 0 || u.SampleSeconds > 86400 || !(u.SampleSeconds >= 0) || u.PeakMemoryBytes > 1<<50 ||
			(u.MeanSMPercent != nil && !(*u.MeanSMPercent >= 0 && *u.MeanSMPercent <= 100*maxNodeGPUs)) {
			return e, errors.New("gpu: samples and their interval not negative, peak memory at most 1 PiB, mean SM use 0 to 100 per GPU")
		}
	}
	return e, nil
}
