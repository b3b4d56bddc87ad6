package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// filler sets every exported field of a value, through pointers, slices
// (two elements) and maps (two entries), each scalar to a value of its
// own: a field mapped to another, or not at all, shows.
type filler struct {
	n   int
	rnd *rand.Rand // nil: every bool true
}

func (f *filler) fill(v reflect.Value) {
	f.n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", f.n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(f.n))
	case reflect.Uint64:
		v.SetUint(uint64(f.n) << 33)
	case reflect.Float64:
		v.SetFloat(float64(f.n) + 0.25)
	case reflect.Bool:
		v.SetBool(f.rnd == nil || f.rnd.IntN(2) == 0)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			k.SetString(fmt.Sprintf("<key%d>", i))
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		switch v.Type() {
		case reflect.TypeFor[time.Time]():
			v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(f.n), int64(f.n)).UTC()))
			return
		case reflect.TypeFor[snapshot.Snapshot]():
			// A document of its own: stored as package snapshot encodes it.
			v.Set(reflect.ValueOf(snapshot.Snapshot{SchemaVersion: f.n, Host: snapshot.Host{Hostname: "h"}}))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i))
			}
		}
	default:
		panic(fmt.Sprintf("filler: %s", v.Type()))
	}
}

func fillNew[T any](f *filler) T {
	var v T
	f.fill(reflect.ValueOf(&v).Elem())
	return v
}

// stored is one of each kind of row, with every field set, as read back.
type stored struct {
	lease  *api.Lease
	job    *api.Job
	node   NodeRecord
	limits api.Limits
}

// writeFilled writes a filled lease, job, node and project into a new
// database with the store's write API.
func writeFilled(t *testing.T, f *filler) (*Store, stored) {
	t.Helper()
	in := stored{lease: fillNew[*api.Lease](f), job: fillNew[*api.Job](f), node: fillNew[NodeRecord](f), limits: fillNew[api.Limits](f)}
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	t.Cleanup(func() { s.Close() })
	var w Writes
	if err := w.PutLease(in.lease); err != nil {
		t.Fatal(err)
	}
	if err := w.PutJob(in.job); err != nil {
		t.Fatal(err)
	}
	if err := w.PutNode(in.node); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(context.Background(), &w); err != nil {
		t.Fatal(err)
	}
	err := s.Update(context.Background(), func(tx *Tx) error {
		return tx.PutProject(api.Project{Name: "p", Weight: 1, PeriodSeconds: 60, Limits: in.limits})
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, in
}

// TestRowsRoundTrip writes values with every field set and reads them
// back: every field of api's lease, job, node and limits is mapped to a
// row field and back to itself. A field added to api and not to the
// mapping fails here.
func TestRowsRoundTrip(t *testing.T) {
	for seed := range uint64(8) {
		f := &filler{rnd: rand.New(rand.NewPCG(seed, 1))}
		if seed == 0 {
			f.rnd = nil
		}
		s, in := writeFilled(t, f)
		// Derived, not stored.
		wantLease := *in.lease
		wantLease.QueuePosition, wantLease.EstimatedStart, wantLease.Ports, wantLease.Deployment = 0, nil, nil, nil
		err := s.View(context.Background(), func(tx *Tx) error {
			l, err := tx.Lease(in.lease.ID)
			if err != nil {
				return err
			}
			same(t, "lease", l, &wantLease)
			j, err := tx.Job(in.job.ID)
			if err != nil {
				return err
			}
			same(t, "job", j, in.job)
			nodes, err := tx.Nodes()
			if err != nil {
				return err
			}
			same(t, "nodes", nodes, []NodeRecord{in.node})
			ps, err := tx.Projects()
			if err != nil {
				return err
			}
			if len(ps) != 1 {
				t.Fatalf("%d projects, want 1", len(ps))
			}
			same(t, "limits", ps[0].Limits, in.limits)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// storedKeys lists the key paths of a stored JSON document: "a.b" for a
// key b of object a, "a[]" for the elements of array a. Map keys appear
// as the filler wrote them (<key0>); below a path in opaque, nothing is
// listed.
func storedKeys(t *testing.T, data string, opaque ...string) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		if slices.Contains(opaque, path) {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				p := k
				if path != "" {
					p = path + "." + k
				}
				seen[p] = true
				walk(p, e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The key paths of what the store keeps as JSON. A change here is a change
// of every database in use: it takes a migration that rewrites the rows.
var goldenKeys = map[string][]string{
	"leases.data": {
		"allocations", "allocations[].choose", "allocations[].devices", "allocations[].devices[].id", "allocations[].devices[].index",
		"allocations[].devices[].isolation", "allocations[].devices[].memory_bytes", "allocations[].devices[].milli_gpu",
		"allocations[].devices[].model", "allocations[].devices[].pci_address", "allocations[].devices[].uuid",
		"allocations[].devices[].vendor", "allocations[].node", "allocations[].sandbox",
		"allocations[].sandbox.cgroup", "allocations[].sandbox.clean_env", "allocations[].sandbox.devices",
		"allocations[].sandbox.missing", "allocations[].sandbox.mount_namespace", "allocations[].sandbox.no_new_privileges",
		"allocations[].sandbox.own_user", "allocations[].sandbox.pid_namespace", "allocations[].sandbox.private_tmp",
		"allocations[].sandbox.user",
		"created_at", "ended_at", "ends_at", "gpus_equivalent", "granted_at", "holding", "id", "isolation", "jobs",
		"project", "reason",
		"request", "request.constraints", "request.constraints.architecture", "request.constraints.gang",
		"request.constraints.min_compute_capability", "request.constraints.min_cuda", "request.constraints.min_driver",
		"request.constraints.min_memory_bytes", "request.constraints.model", "request.constraints.nodes",
		"request.constraints.same_numa", "request.constraints.same_nvlink_island", "request.constraints.vendor",
		"request.fraction", "request.gpus", "request.job", "request.job.command", "request.job.env",
		"request.job.env.<key0>", "request.job.env.<key1>", "request.job.image", "request.job.model", "request.job.model.digest",
		"request.job.model.ref", "request.job.ports", "request.job.workdir",
		"request.memory_bytes", "request.mig", "request.name", "request.placement", "request.preemptible", "request.priority",
		"request.project", "request.require", "request.resources", "request.resources.cpu_milli",
		"request.resources.memory_bytes", "request.serve", "request.serve.engine", "request.serve.model",
		"request.serve.port", "request.serve.ready", "request.serve.source", "request.time_limit_s",
		"state", "stop_deadline", "user",
	},
	"jobs.data": {
		"created_at", "exit_code", "finished_at", "id", "lease_id", "project", "reason",
		"spec", "spec.command", "spec.env", "spec.env.<key0>", "spec.env.<key1>", "spec.image", "spec.model", "spec.model.digest",
		"spec.model.ref", "spec.ports", "spec.workdir",
		"started_at", "state",
		"tasks", "tasks[].exit_code", "tasks[].gpu", "tasks[].gpu.mean_sm_percent", "tasks[].gpu.peak_memory_bytes", "tasks[].gpu.sample_s", "tasks[].gpu.samples", "tasks[].node", "tasks[].open_ports", "tasks[].rank", "tasks[].reason", "tasks[].state",
	},
	"nodes.data": {
		"cert_sha256", "key_sha256",
		"node", "node.containers", "node.cuda",
		"node.devices", "node.devices[].architecture", "node.devices[].compute_capability", "node.devices[].drain_reason",
		"node.devices[].drained", "node.devices[].held", "node.devices[].id", "node.devices[].index",
		"node.devices[].island", "node.devices[].isolation", "node.devices[].leases", "node.devices[].memory_bytes",
		"node.devices[].mig_mode", "node.devices[].mig_profile", "node.devices[].model", "node.devices[].numa_node",
		"node.devices[].parent", "node.devices[].pci_address", "node.devices[].used_milli", "node.devices[].uuid",
		"node.devices[].vendor",
		"node.driver", "node.executor",
		"node.findings", "node.findings[].devices", "node.findings[].id", "node.findings[].remedy", "node.findings[].severity", "node.findings[].title",
		"node.free_gpus", "node.hostname", "node.id", "node.joined_at", "node.last_seen", "node.no_containers",
		"node.recorded",
		"node.sandbox", "node.sandbox.cgroup", "node.sandbox.clean_env", "node.sandbox.devices", "node.sandbox.missing",
		"node.sandbox.mount_namespace", "node.sandbox.no_new_privileges", "node.sandbox.own_user",
		"node.sandbox.pid_namespace", "node.sandbox.private_tmp", "node.sandbox.user",
		"node.state", "node.total_gpus",
		"replacing", "snapshot",
	},
	"projects.limits": {
		"max_env_bytes", "max_jobs_per_lease", "max_log_bytes", "max_log_bytes_per_job", "max_queued",
		"max_queued_per_user",
	},
}

// TestStoredKeys writes values with every field set and lists the keys of
// the JSON stored: exactly the golden ones. The names come from the row
// types, not from api, so renaming a field of api changes nothing here
// unless the rows change too.
func TestStoredKeys(t *testing.T) {
	s, _ := writeFilled(t, &filler{}) // every bool true: omitempty keeps them all
	for col, q := range map[string]string{
		"leases.data":     `SELECT data FROM leases`,
		"jobs.data":       `SELECT data FROM jobs`,
		"nodes.data":      `SELECT data FROM nodes`,
		"projects.limits": `SELECT limits FROM projects`,
	} {
		var data string
		if err := s.rdb.QueryRow(q).Scan(&data); err != nil {
			t.Fatal(err)
		}
		got := storedKeys(t, data, "snapshot")
		want := goldenKeys[col]
		if !slices.Equal(got, want) {
			var extra, missing []string
			for _, k := range got {
				if !slices.Contains(want, k) {
					extra = append(extra, k)
				}
			}
			for _, k := range want {
				if !slices.Contains(got, k) {
					missing = append(missing, k)
				}
			}
			t.Errorf("%s: stored keys changed: new %q, gone %q", col, extra, missing)
		}
	}
}

// TestRowsHoldNoAPITypes: no row type holds a type of package api, whose
// JSON names would then become stored names.
func TestRowsHoldNoAPITypes(t *testing.T) {
	apiPkg := reflect.TypeFor[api.Lease]().PkgPath()
	seen := map[reflect.Type]bool{}
	var walk func(path string, ty reflect.Type)
	walk = func(path string, ty reflect.Type) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Map {
			ty = ty.Elem()
		}
		if ty.PkgPath() == apiPkg {
			t.Errorf("%s is %s: rows must not hold api types", path, ty)
		}
		if ty.Kind() != reflect.Struct || seen[ty] || !strings.HasSuffix(ty.PkgPath(), "/store") {
			return
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			walk(path+"."+f.Name, f.Type)
		}
	}
	for _, ty := range []reflect.Type{
		reflect.TypeFor[leaseRow](), reflect.TypeFor[jobRow](), reflect.TypeFor[nodeRow](), reflect.TypeFor[limitsRow](),
	} {
		walk(ty.Name(), ty)
	}
}
