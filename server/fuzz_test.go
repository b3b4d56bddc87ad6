package server

import (
	"encoding/json"
	"regexp"
	"testing"

	"kiln.dev/kiln/lease"
	"kiln.dev/kiln/placement"

	"kiln.dev/kiln/api"
)

// The request decoders never panic; what they accept is valid.
func FuzzParseLeaseRequest(f *testing.F) {
	for _, s := range []string{
		`{"project":"vision","gpus":2,"constraints":{"same_nvlink_island":true,"min_cuda":"12.2"},"time_limit_s":3600,"priority":5,"job":{"command":["python","train.py"],"env":{"SEED":"1"}}}`,
		`{"project":"speech","fraction":0.25,"memory_bytes":21474836480,"preemptible":true}`,
		`{"mig":"1g.10gb"}`,
		`{"gpus":16,"constraints":{"gang":true}}`,
		`{"gpus":-1}`, `{"fraction":1.5}`, `{"gpus":1,"fraction":0.5}`, `{}`, `[]`, `null`, `{"gpus":1}{"gpus":2}`,
		`{"gpus":1,"unknown":true}`, `{"gpus":1,"job":{"command":[""]}}`,
		`{"gpus":2,"placement":"scheduler","job":{"image":"reg/x:1"}}`, `{"fraction":0.5,"placement":"scheduler","job":{"image":"reg/x:1"}}`, `{"gpus":1,"job":{"env":{"A=B":"c"},"command":["x"]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseLeaseRequest(b)
		if err != nil {
			return
		}
		kinds := 0
		if r.GPUs > 0 {
			kinds++
		}
		if r.Fraction > 0 && r.Fraction < 1 {
			kinds++
		}
		if r.MIG != "" {
			kinds++
		}
		if kinds != 1 || r.GPUs < 0 || r.Priority < -1000 || r.Priority > 1000 || r.TimeLimitSeconds < 0 {
			t.Fatalf("accepted an invalid request: %+v", r)
		}
		if lease.NeedOf(r) <= 0 {
			t.Fatalf("accepted request needs %v GPUs: %+v", lease.NeedOf(r), r)
		}
		req := lease.RequestOf(r)
		if r.Fraction > 0 && (req.MilliGPU < 1 || req.MilliGPU > 999) {
			t.Fatalf("fraction %v became %d‰", r.Fraction, req.MilliGPU)
		}
		if r.Job != nil && len(r.Job.Command) == 0 && r.Job.Image == "" {
			t.Fatalf("accepted an empty job")
		}
		if r.Placement == api.PlacementScheduler && (r.GPUs == 0 || r.Job == nil || r.Job.Image == "" || r.Constraints.Gang || r.Constraints.SameNVLinkIsland) {
			t.Fatalf("accepted placement scheduler for %+v", r)
		}
		if r.Placement != "" && r.Placement != api.PlacementKiln && r.Placement != api.PlacementScheduler {
			t.Fatalf("accepted placement %q", r.Placement)
		}
	})
}

func FuzzParseAgentMessages(f *testing.F) {
	snap, _ := json.Marshal(api.RegisterRequest{Running: []string{"j-1"}})
	for _, s := range []string{
		`{"running":["j-1","j-2"],"wait_ms":2000}`, `{"running":null}`, `{"wait_ms":-5}`,
		`{"code":0,"reason":"exited"}`, `{"code":137,"signal":"killed","reason":"preempted by lease l-2"}`,
		`{"token":"kjoin_ab_cd","node":"hgx-1","csr_pem":"x"}`, `{"node":"Bad Name"}`,
		`{"snapshot":{"schema_version":1,"gpus":[{"index":0,"vendor":"nvidia","mig":{"enabled":true,"instances":[{"gi":1,"ci":0}]}}]}}`,
		string(snap), `{"devices":["gpu0"],"reason":"fan","undrain":false}`,
		`{"name":"vision","weight":3,"max_gpus":8}`, `{"name":"vision","held_gpus":8,"used_gpu_hours":1,"queued_leases":3}`, `{"user":"ana","role":"member","projects":["vision"]}`,
		`{"running":[],"samples":[{"gpu":0,"util":42.5,"mem_used":1073741824,"power_w":310,"temp_c":51,"procs":2},{"gpu":1}]}`,
		`{"running":[],"samples":[{"gpu":0,"util":101}]}`, `{"running":[],"samples":[{"gpu":3},{"gpu":3}]}`,
		`{"code":0,"reason":"exited","gpu":{"peak_memory_bytes":1073741824,"mean_sm_percent":61.5,"samples":12,"sample_s":5}}`,
		`{"code":0,"reason":"x","gpu":{"peak_memory_bytes":1,"mean_sm_percent":-1,"samples":1,"sample_s":5}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := parseHeartbeat(b); err == nil {
			if h.WaitMS < 0 || len(h.Running) > 100000 || len(h.Samples) > maxNodeGPUs {
				t.Fatalf("heartbeat %+v accepted", h)
			}
			seen := map[int]bool{}
			for _, x := range h.Samples {
				if x.GPU < 0 || x.GPU >= maxNodeGPUs || seen[x.GPU] || (x.Utilization != nil && !(*x.Utilization >= 0 && *x.Utilization <= 100)) ||
					(x.PowerW != nil && !(*x.PowerW >= 0)) || (x.Processes != nil && *x.Processes < 0) {
					t.Fatalf("heartbeat sample %+v accepted", x)
				}
				seen[x.GPU] = true
			}
		}
		if e, err := parseExit(b); err == nil {
			if len(e.Reason) > 4096 {
				t.Fatal("long exit reason accepted")
			}
			if u := e.GPU; u != nil && (u.Samples < 0 || !(u.SampleSeconds >= 0) || (u.MeanSMPercent != nil && !(*u.MeanSMPercent >= 0))) {
				t.Fatalf("GPU use %+v accepted", u)
			}
		}
		if j, err := parseJoin(b); err == nil && (!nameRE.MatchString(j.Node) || j.Token == "") {
			t.Fatalf("join %+v accepted", j)
		}
		if r, err := parseRegister(b); err == nil {
			if r.Snapshot == nil {
				t.Fatal("register without a snapshot accepted")
			}
			for _, d := range placement.Devices(r.Snapshot, nil) {
				if d.ID == "" {
					t.Fatal("device without an id")
				}
			}
		}
		if p, err := parseProject(b); err == nil && (!nameRE.MatchString(p.Name) || p.Weight < 0 || p.MaxGPUs < 0 || p.HeldGPUs != 0 || p.UsedHours != 0 || p.QueuedLease != 0) {
			t.Fatalf("project %+v accepted", p)
		}
		if r, err := parseTokenRequest(b); err == nil && r.Role != "" && r.Role != api.RoleAdmin && r.Role != api.RoleMember {
			t.Fatalf("role %q accepted", r.Role)
		}
		_, _ = parseDrain(b)
	})
}

// The name, environment key and version checks agree with the grammar they
// implement, written as regular expressions.
var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	versionRE = regexp.MustCompile(`^[0-9]{1,5}(\.[0-9]{1,5}){0,3}$`)
)

func FuzzValidators(f *testing.F) {
	for _, s := range []string{"", "a", "vision", "Vision", "-a", "a-", "a.b_c-d", "9", "12.2", "535.183.01", "1.2.3.4",
		"1.2.3.4.5", "123456", "1..2", ".1", "1.", "_X", "A_1", "1A", "a b", "a\n", "ü",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Errorf("validName(%q) = %v, want %v", s, got, want)
		}
		if got, want := validEnvKey(s), envKeyRE.MatchString(s); got != want {
			t.Errorf("validEnvKey(%q) = %v, want %v", s, got, want)
		}
		if got, want := validVersion(s), versionRE.MatchString(s); got != want {
			t.Errorf("validVersion(%q) = %v, want %v", s, got, want)
		}
	})
}
