//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// NCCL's types as nccl.h declares them: results, data types and reduction
// operations are ints, communicators and streams opaque pointers.
typedef int knccl_r;

typedef struct {
	void *h;
	knccl_r (*GetVersion)(int *);
	knccl_r (*CommInitAll)(void **, int, const int *);
	knccl_r (*CommDestroy)(void *);
	knccl_r (*GroupStart)(void);
	knccl_r (*GroupEnd)(void);
	knccl_r (*AllReduce)(const void *, void *, size_t, int, int, void *, void *);
	knccl_r (*AllGather)(const void *, void *, size_t, int, void *, void *);
	knccl_r (*ReduceScatter)(const void *, void *, size_t, int, int, void *, void *);
	const char *(*GetErrorString)(knccl_r);
} knccl;

static knccl *knccl_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	knccl *k = calloc(1, sizeof *k);
	if (!k) {
		snprintf(err, errlen, "out of memory");
		dlclose(h);
		return NULL;
	}
	k->h = h;
#define SYM(field, name) do { *(void **)(&k->field) = dlsym(h, name); if (!k->field) { snprintf(err, errlen, "%s has no %s", path, name); free(k); dlclose(h); return NULL; } } while (0)
	SYM(GetVersion, "ncclGetVersion");
	SYM(CommInitAll, "ncclCommInitAll");
	SYM(CommDestroy, "ncclCommDestroy");
	SYM(GroupStart, "ncclGroupStart");
	SYM(GroupEnd, "ncclGroupEnd");
	SYM(AllReduce, "ncclAllReduce");
	SYM(AllGather, "ncclAllGather");
	SYM(ReduceScatter, "ncclReduceScatter");
	SYM(GetErrorString, "ncclGetErrorString");
#undef SYM
	return k;
}

static knccl_r knccl_version(knccl *k, int *v) { return k->GetVersion(v); }

static knccl_r knccl_init_all(knccl *k, int n, const int *devs, uint64_t *comms) {
	void **c = calloc(n, sizeof *c);
	if (!c) return 1;
	knccl_r r = k->CommInitAll(c, n, devs);
	for (int i = 0; i < n; i++) comms[i] = (uint64_t)(uintptr_t)c[i];
	free(c);
	return r;
}

static knccl_r knccl_destroy(knccl *k, uint64_t comm) { return k->CommDestroy((void *)(uintptr_t)comm); }

// ncclFloat32 is 7 and ncclSum 0 in every NCCL and RCCL release.
enum { kFloat32 = 7, kSum = 0 };

// knccl_launch enqueues op (0 all-reduce, 1 all-gather, 2 reduce-scatter)
// on every rank in one group. If a launch fails the group is still ended,
// and the first error returned.
static knccl_r knccl_launch(knccl *k, int op, int n, const uint64_t *send, const uint64_t *recv, size_t count, const uint64_t *comms, const uint64_t *streams) {
	knccl_r first = k->GroupStart();
	if (first) return first;
	for (int i = 0; i < n && !first; i++) {
		const void *s = (const void *)(uintptr_t)send[i];
		void *d = (void *)(uintptr_t)recv[i];
		void *c = (void *)(uintptr_t)comms[i];
		void *st = (void *)(uintptr_t)streams[i];
		switch (op) {
		case 0: first = k->AllReduce(s, d, count, kFloat32, kSum, c, st); break;
		case 1: first = k->AllGather(s, d, count, kFloat32, c, st); break;
		default: first = k->ReduceScatter(s, d, count, kFloat32, kSum, c, st); break;
		}
	}
	knccl_r r = k->GroupEnd();
	return first ? first : r;
}

static const char *knccl_error(knccl *k, knccl_r r) { return k->GetErrorString(r); }
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"kiln.dev/kiln/gpubench"
)

// Lib is a loaded NCCL or RCCL.
type Lib struct {
	k       *C.knccl
	name    string
	path    string
	version int
}

// Open loads the collective library of a flavour ("nccl" or "rccl"): path,
// or the flavour's Libraries in turn when path is empty. The error of a
// library that cannot be loaded wraps gpubench.ErrNoDriver.
func Open(flavour, path string) (*Lib, error) {
	paths := []string{path}
	if path == "" {
		paths = Libraries[flavour]
		if paths == nil {
			return nil, fmt.Errorf("collective library %q: want nccl or rccl", flavour)
		}
	}
	var reasons []string
	for _, p := range paths {
		cpath := C.CString(p)
		var errbuf [512]C.char
		k := C.knccl_open(cpath, &errbuf[0], C.size_t(len(errbuf)))
		C.free(unsafe.Pointer(cpath))
		if k == nil {
			reasons = append(reasons, C.GoString(&errbuf[0]))
			continue
		}
		l := &Lib{k: k, name: flavour, path: p}
		var v C.int
		if r := C.knccl_version(k, &v); r == 0 {
			l.version = int(v)
		}
		return l, nil
	}
	return nil, gpubench.NoDriver(fmt.Errorf("cannot load %s: %s", strings.ToUpper(flavour), gpubench.NotFound(paths, reasons)))
}

// Name implements gpubench.Collectives.
func (l *Lib) Name() string { return l.name }

// Version implements gpubench.Collectives.
func (l *Lib) Version() string { return versionText(l.version) }

// Path is the library loaded.
func (l *Lib) Path() string { return l.path }

func (l *Lib) err(call string, r C.knccl_r) error {
	s := C.GoString(C.knccl_error(l.k, r))
	if s == "" {
		s = fmt.Sprintf("error %d", int(r))
	}
	return fmt.Errorf("%s: %s", call, s)
}

// Comms implements gpubench.Collectives with ncclCommInitAll.
func (l *Lib) Comms(devs []int) (gpubench.Comms, error) {
	if len(devs) == 0 {
		return nil, errors.New("no GPU to make communicators on")
	}
	cdevs := make([]C.int, len(devs))
	for i, d := range devs {
		cdevs[i] = C.int(d)
	}
	comms := make([]C.uint64_t, len(devs))
	if r := C.knccl_init_all(l.k, C.int(len(devs)), &cdevs[0], &comms[0]); r != 0 {
		return nil, l.err("ncclCommInitAll", r)
	}
	return &group{l: l, comms: comms}, nil
}

type group struct {
	l     *Lib
	comms []C.uint64_t
}

func (c *group) Ranks() int { return len(c.comms) }

func (c *group) Launch(op gpubench.Op, send, recv []gpubench.Buffer, count int64, streams []gpubench.Stream) error {
	n := len(c.comms)
	if len(send) != n || len(recv) != n || len(streams) != n {
		return fmt.Errorf("a launch needs %d buffers and streams, one per rank", n)
	}
	code := map[gpubench.Op]C.int{gpubench.AllReduce: 0, gpubench.AllGather: 1, gpubench.ReduceScatter: 2}
	o, ok := code[op]
	if !ok {
		return fmt.Errorf("collective %q is not one kiln runs", op)
	}
	s := make([]C.uint64_t, n)
	r := make([]C.uint64_t, n)
	st := make([]C.uint64_t, n)
	for i := range n {
		s[i], r[i], st[i] = C.uint64_t(send[i].Addr), C.uint64_t(recv[i].Addr), C.uint64_t(streams[i].Handle)
	}
	if rc := C.knccl_launch(c.l.k, o, C.int(n), &s[0], &r[0], C.size_t(count), &c.comms[0], &st[0]); rc != 0 {
		return c.l.err("nccl "+string(op), rc)
	}
	return nil
}

func (c *group) Close() error {
	var errs []error
	for _, comm := range c.comms {
		if r := C.knccl_destroy(c.l.k, comm); r != 0 {
			errs = append(errs, c.l.err("ncclCommDestroy", r))
		}
	}
	c.comms = nil
	return errors.Join(errs...)
}
