//go:build cgo

package cudadrv

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The CUDA driver API's types, as cuda.h declares them on 64-bit Linux:
// CUresult and CUdevice are ints, CUdeviceptr is an unsigned 64-bit
// integer, contexts, streams and events are opaque pointers. kiln does not
// include cuda.h: the library is found at run time.
typedef int kcu_r;

typedef struct {
	void *h;
	kcu_r (*Init)(unsigned int);
	kcu_r (*DriverGetVersion)(int *);
	kcu_r (*DeviceGetCount)(int *);
	kcu_r (*DeviceGet)(int *, int);
	kcu_r (*DeviceGetName)(char *, int, int);
	kcu_r (*DeviceGetPCIBusId)(char *, int, int);
	kcu_r (*DeviceTotalMem)(size_t *, int);
	kcu_r (*PrimaryCtxRetain)(void **, int);
	kcu_r (*PrimaryCtxRelease)(int);
	kcu_r (*CtxSetCurrent)(void *);
	kcu_r (*MemAlloc)(uint64_t *, size_t);
	kcu_r (*MemFree)(uint64_t);
	kcu_r (*MemHostRegister)(void *, size_t, unsigned int);
	kcu_r (*MemHostUnregister)(void *);
	kcu_r (*MemcpyHtoDAsync)(uint64_t, const void *, size_t, void *);
	kcu_r (*MemcpyDtoHAsync)(void *, uint64_t, size_t, void *);
	kcu_r (*MemcpyDtoDAsync)(uint64_t, uint64_t, size_t, void *);
	kcu_r (*MemcpyPeerAsync)(uint64_t, void *, uint64_t, void *, size_t, void *);
	kcu_r (*StreamCreate)(void **, unsigned int);
	kcu_r (*StreamDestroy)(void *);
	kcu_r (*StreamWaitEvent)(void *, void *, unsigned int);
	kcu_r (*EventCreate)(void **, unsigned int);
	kcu_r (*EventDestroy)(void *);
	kcu_r (*EventRecord)(void *, void *);
	kcu_r (*EventSynchronize)(void *);
	kcu_r (*EventElapsedTime)(float *, void *, void *);
	kcu_r (*DeviceCanAccessPeer)(int *, int, int);
	kcu_r (*CtxEnablePeerAccess)(void *, unsigned int);
	kcu_r (*GetErrorName)(kcu_r, const char **);
	kcu_r (*GetErrorString)(kcu_r, const char **);
	// Optional (CUDA 10.0 and later).
	kcu_r (*LaunchHostFunc)(void *, void (*)(void *), void *);
} kcuda;

// kcu_open loads the library and its symbols. On failure it returns NULL
// and names what was missing in err.
static kcuda *kcu_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	kcuda *k = calloc(1, sizeof *k);
	if (!k) {
		snprintf(err, errlen, "out of memory");
		dlclose(h);
		return NULL;
	}
	k->h = h;
#define SYM(field, name) do { *(void **)(&k->field) = dlsym(h, name); if (!k->field) { snprintf(err, errlen, "%s has no %s", path, name); free(k); dlclose(h); return NULL; } } while (0)
#define SYM2(field, name, old) do { *(void **)(&k->field) = dlsym(h, name); if (!k->field) *(void **)(&k->field) = dlsym(h, old); if (!k->field) { snprintf(err, errlen, "%s has no %s", path, name); free(k); dlclose(h); return NULL; } } while (0)
	SYM(Init, "cuInit");
	SYM(DriverGetVersion, "cuDriverGetVersion");
	SYM(DeviceGetCount, "cuDeviceGetCount");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(DeviceGetName, "cuDeviceGetName");
	SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
	SYM2(DeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
	SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM2(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(MemAlloc, "cuMemAlloc_v2");
	SYM(MemFree, "cuMemFree_v2");
	SYM2(MemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister");
	SYM(MemHostUnregister, "cuMemHostUnregister");
	SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
	SYM(MemcpyPeerAsync, "cuMemcpyPeerAsync");
	SYM(StreamCreate, "cuStreamCreate");
	SYM2(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
	SYM(StreamWaitEvent, "cuStreamWaitEvent");
	SYM(EventCreate, "cuEventCreate");
	SYM2(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
	SYM(EventRecord, "cuEventRecord");
	SYM(EventSynchronize, "cuEventSynchronize");
	SYM(EventElapsedTime, "cuEventElapsedTime");
	SYM(DeviceCanAccessPeer, "cuDeviceCanAccessPeer");
	SYM(CtxEnablePeerAccess, "cuCtxEnablePeerAccess");
	SYM(GetErrorName, "cuGetErrorName");
	SYM(GetErrorString, "cuGetErrorString");
	*(void **)(&k->LaunchHostFunc) = dlsym(h, "cuLaunchHostFunc");
#undef SYM
#undef SYM2
	return k;
}

// Every call that needs a context makes the device's primary context
// current on the calling thread first, in the same C call: Go may run the
// next call on another thread.
#define CTX(ctx) do { kcu_r r_ = k->CtxSetCurrent((void *)(uintptr_t)(ctx)); if (r_) return r_; } while (0)

static kcu_r kcu_init(kcuda *k) { return k->Init(0); }
static kcu_r kcu_version(kcuda *k, int *v) { return k->DriverGetVersion(v); }
static kcu_r kcu_count(kcuda *k, int *n) { return k->DeviceGetCount(n); }

static kcu_r kcu_device(kcuda *k, int ordinal, int *dev, char *name, int namelen, char *bus, int buslen, uint64_t *mem, uint64_t *ctx) {
	kcu_r r = k->DeviceGet(dev, ordinal);
	if (r) return r;
	if ((r = k->DeviceGetName(name, namelen, *dev))) return r;
	if ((r = k->DeviceGetPCIBusId(bus, buslen, *dev))) return r;
	size_t m = 0;
	if ((r = k->DeviceTotalMem(&m, *dev))) return r;
	*mem = m;
	void *c = NULL;
	if ((r = k->PrimaryCtxRetain(&c, *dev))) return r;
	*ctx = (uint64_t)(uintptr_t)c;
	return 0;
}

static kcu_r kcu_release(kcuda *k, int dev) { return k->PrimaryCtxRelease(dev); }

static kcu_r kcu_alloc(kcuda *k, uint64_t ctx, size_t bytes, uint64_t *ptr) { CTX(ctx); return k->MemAlloc(ptr, bytes); }
static kcu_r kcu_free(kcuda *k, uint64_t ctx, uint64_t ptr) { CTX(ctx); return k->MemFree(ptr); }

// CU_MEMHOSTREGISTER_PORTABLE: pinned for every context, not only the
// current one.
static kcu_r kcu_register(kcuda *k, uint64_t ctx, uint64_t addr, size_t bytes) { CTX(ctx); return k->MemHostRegister((void *)(uintptr_t)addr, bytes, 0x01); }
static kcu_r kcu_unregister(kcuda *k, uint64_t ctx, uint64_t addr) { CTX(ctx); return k->MemHostUnregister((void *)(uintptr_t)addr); }

static kcu_r kcu_h2d(kcuda *k, uint64_t ctx, uint64_t dst, uint64_t src, size_t n, uint64_t s) { CTX(ctx); return k->MemcpyHtoDAsync(dst, (const void *)(uintptr_t)src, n, (void *)(uintptr_t)s); }
static kcu_r kcu_d2h(kcuda *k, uint64_t ctx, uint64_t dst, uint64_t src, size_t n, uint64_t s) { CTX(ctx); return k->MemcpyDtoHAsync((void *)(uintptr_t)dst, src, n, (void *)(uintptr_t)s); }
static kcu_r kcu_d2d(kcuda *k, uint64_t ctx, uint64_t dst, uint64_t src, size_t n, uint64_t s) { CTX(ctx); return k->MemcpyDtoDAsync(dst, src, n, (void *)(uintptr_t)s); }
static kcu_r kcu_peer(kcuda *k, uint64_t ctx, uint64_t dst, uint64_t dctx, uint64_t src, uint64_t sctx, size_t n, uint64_t s) {
	CTX(ctx);
	return k->MemcpyPeerAsync(dst, (void *)(uintptr_t)dctx, src, (void *)(uintptr_t)sctx, n, (void *)(uintptr_t)s);
}

// CU_STREAM_NON_BLOCKING: the stream does not wait for the legacy default
// stream.
static kcu_r kcu_stream(kcuda *k, uint64_t ctx, uint64_t *s) {
	CTX(ctx);
	void *p = NULL;
	kcu_r r = k->StreamCreate(&p, 0x1);
	*s = (uint64_t)(uintptr_t)p;
	return r;
}
static kcu_r kcu_stream_destroy(kcuda *k, uint64_t ctx, uint64_t s) { CTX(ctx); return k->StreamDestroy((void *)(uintptr_t)s); }
static kcu_r kcu_wait(kcuda *k, uint64_t ctx, uint64_t s, uint64_t e) { CTX(ctx); return k->StreamWaitEvent((void *)(uintptr_t)s, (void *)(uintptr_t)e, 0); }

// CU_EVENT_DEFAULT: an event that records time.
static kcu_r kcu_event(kcuda *k, uint64_t ctx, uint64_t *e) {
	CTX(ctx);
	void *p = NULL;
	kcu_r r = k->EventCreate(&p, 0);
	*e = (uint64_t)(uintptr_t)p;
	return r;
}
static kcu_r kcu_event_destroy(kcuda *k, uint64_t ctx, uint64_t e) { CTX(ctx); return k->EventDestroy((void *)(uintptr_t)e); }
static kcu_r kcu_record(kcuda *k, uint64_t ctx, uint64_t e, uint64_t s) { CTX(ctx); return k->EventRecord((void *)(uintptr_t)e, (void *)(uintptr_t)s); }
static kcu_r kcu_sync(kcuda *k, uint64_t ctx, uint64_t e) { CTX(ctx); return k->EventSynchronize((void *)(uintptr_t)e); }
static kcu_r kcu_elapsed(kcuda *k, uint64_t ctx, uint64_t a, uint64_t b, float *ms) { CTX(ctx); return k->EventElapsedTime(ms, (void *)(uintptr_t)a, (void *)(uintptr_t)b); }
static kcu_r kcu_can_peer(kcuda *k, int dev, int peer, int *ok) { return k->DeviceCanAccessPeer(ok, dev, peer); }
static kcu_r kcu_enable_peer(kcuda *k, uint64_t ctx, uint64_t peer) { CTX(ctx); return k->CtxEnablePeerAccess((void *)(uintptr_t)peer, 0); }

// A gate is a host function queued on a stream that spins until its flag
// is set, holding the work queued behind it; it frees the flag when it
// returns. The flag is C memory: the driver's thread reads it after the
// Go call that queued it has returned.
static void kcu_gate_fn(void *p) {
	int *flag = p;
	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) sched_yield();
	free(flag);
}
static int kcu_has_gate(kcuda *k) { return k->LaunchHostFunc != NULL; }
static kcu_r kcu_gate(kcuda *k, uint64_t ctx, uint64_t s, uint64_t *handle) {
	CTX(ctx);
	int *flag = calloc(1, sizeof *flag);
	if (!flag) return 2;
	kcu_r r = k->LaunchHostFunc((void *)(uintptr_t)s, kcu_gate_fn, flag);
	if (r) { free(flag); return r; }
	*handle = (uint64_t)(uintptr_t)flag;
	return 0;
}
static void kcu_open_gate(uint64_t handle) { __atomic_store_n((int *)(uintptr_t)handle, 1, __ATOMIC_RELEASE); }

static const char *kcu_error(kcuda *k, kcu_r r, int string) {
	const char *s = NULL;
	if (string) k->GetErrorString(r, &s);
	else k->GetErrorName(r, &s);
	return s;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/hostmem"
	"kiln.dev/kiln/snapshot"
)

// CUDA result codes kiln reads.
const (
	cudaErrorNoDevice                   = 100
	cudaErrorPeerAccessAlreadyEnabled   = 704
	cudaErrorNotInitialized             = 3
	cudaErrorInsufficientDriver         = 35
	cudaErrorSystemDriverMismatch       = 803
	cudaErrorCompatNotSupportedOnDevice = 804
)

// Driver is the CUDA driver API, loaded at run time.
type Driver struct {
	k       *C.kcuda
	path    string
	version int
	devs    []gpubench.Device
	cudev   []C.int
	ctx     []C.uint64_t
	sysRoot string
	// host keeps the mapped regions by address.
	host map[uint64]*hostmem.Region
}

// Open loads libcuda (DefaultLibrary when path is empty) and initialises
// it. A library that cannot be loaded, a driver that cannot start and a
// machine without a CUDA GPU give an error wrapping gpubench.ErrNoDriver.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = DefaultLibrary
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	k := C.kcu_open(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if k == nil {
		return nil, gpubench.NoDriver(fmt.Errorf("cannot load the CUDA driver (is the NVIDIA driver installed?): %s", gpubench.NotFound([]string{path}, []string{C.GoString(&errbuf[0])})))
	}
	d := &Driver{k: k, path: path, sysRoot: "/", host: map[uint64]*hostmem.Region{}}
	if r := C.kcu_init(k); r != 0 {
		err := d.err("cuInit", r)
		if r == cudaErrorNoDevice || r == cudaErrorInsufficientDriver || r == cudaErrorSystemDriverMismatch || r == cudaErrorCompatNotSupportedOnDevice || r == cudaErrorNotInitialized {
			err = gpubench.NoDriver(err)
		}
		return nil, err
	}
	var v C.int
	if r := C.kcu_version(k, &v); r != 0 {
		return nil, d.err("cuDriverGetVersion", r)
	}
	d.version = int(v)
	var n C.int
	if r := C.kcu_count(k, &n); r != 0 {
		return nil, d.err("cuDeviceGetCount", r)
	}
	for i := range int(n) {
		var dev C.int
		var name [256]C.char
		var bus [64]C.char
		var mem, ctx C.uint64_t
		if r := C.kcu_device(k, C.int(i), &dev, &name[0], C.int(len(name)), &bus[0], C.int(len(bus)), &mem, &ctx); r != 0 {
			d.Close()
			return nil, fmt.Errorf("CUDA device %d: %w", i, d.err("cuDevicePrimaryCtxRetain", r))
		}
		g := gpubench.Device{Ordinal: i, Name: C.GoString(&name[0]), MemoryBytes: uint64(mem)}
		if pci, err := snapshot.CanonicalPCI(C.GoString(&bus[0])); err == nil {
			g.PCI = pci
			g.NUMANode = hostmem.DeviceNode(d.sysRoot, pci)
		}
		d.devs = append(d.devs, g)
		d.cudev = append(d.cudev, dev)
		d.ctx = append(d.ctx, ctx)
	}
	return d, nil
}

// err words a CUDA error: the call, the error's name and its text.
func (d *Driver) err(call string, r C.kcu_r) error {
	name := C.GoString(C.kcu_error(d.k, r, 0))
	text := C.GoString(C.kcu_error(d.k, r, 1))
	if name == "" {
		name = fmt.Sprintf("CUDA error %d", int(r))
	}
	if text != "" && !strings.EqualFold(text, name) {
		return fmt.Errorf("%s: %s (%s)", call, name, text)
	}
	return fmt.Errorf("%s: %s", call, name)
}

func (d *Driver) ctxOf(dev int) (C.uint64_t, error) {
	if dev < 0 || dev >= len(d.ctx) {
		return 0, fmt.Errorf("CUDA device %d does not exist (%d devices)", dev, len(d.ctx))
	}
	return d.ctx[dev], nil
}

// Name implements gpubench.Driver.
func (d *Driver) Name() string { return "cuda" }

// Version is the CUDA version the driver supports ("12.4").
func (d *Driver) Version() string { return fmt.Sprintf("%d.%d", d.version/1000, d.version%1000/10) }

// Devices implements gpubench.Driver.
func (d *Driver) Devices() ([]gpubench.Device, error) { return d.devs, nil }

// HostNUMANodes implements gpubench.Driver.
func (d *Driver) HostNUMANodes() []int {
	n, _ := hostmem.Nodes(d.sysRoot)
	return n
}

// AllocHost implements gpubench.Driver: memory mapped and placed by
// hostmem, pinned with cuMemHostRegister (portable to every context).
func (d *Driver) AllocHost(bytes int64, pinned bool, node int) (gpubench.Buffer, error) {
	r, err := hostmem.Alloc(bytes, node)
	if err != nil {
		return gpubench.Buffer{}, err
	}
	kind := gpubench.HostPageable
	if pinned {
		kind = gpubench.HostPinned
		if len(d.ctx) == 0 {
			_ = r.Free()
			return gpubench.Buffer{}, fmt.Errorf("no CUDA device to pin host memory with")
		}
		if rc := C.kcu_register(d.k, d.ctx[0], C.uint64_t(r.Addr()), C.size_t(bytes)); rc != 0 {
			_ = r.Free()
			return gpubench.Buffer{}, d.err("cuMemHostRegister", rc)
		}
	}
	b := gpubench.Buffer{Kind: kind, Device: -1, NUMANode: r.Node, Bytes: bytes, Addr: r.Addr()}
	d.host[b.Addr] = r
	return b, nil
}

// AllocDevice implements gpubench.Driver.
func (d *Driver) AllocDevice(dev int, bytes int64) (gpubench.Buffer, error) {
	ctx, err := d.ctxOf(dev)
	if err != nil {
		return gpubench.Buffer{}, err
	}
	var p C.uint64_t
	if r := C.kcu_alloc(d.k, ctx, C.size_t(bytes), &p); r != 0 {
		return gpubench.Buffer{}, d.err("cuMemAlloc", r)
	}
	return gpubench.Buffer{Kind: gpubench.DeviceMemory, Device: dev, NUMANode: gpubench.AnyNode, Bytes: bytes, Addr: uint64(p)}, nil
}

// Free implements gpubench.Driver.
func (d *Driver) Free(b gpubench.Buffer) error {
	if b.Kind == gpubench.DeviceMemory {
		ctx, err := d.ctxOf(b.Device)
		if err != nil {
			return err
		}
		if r := C.kcu_free(d.k, ctx, C.uint64_t(b.Addr)); r != 0 {
			return d.err("cuMemFree", r)
		}
		return nil
	}
	reg := d.host[b.Addr]
	if reg == nil {
		return fmt.Errorf("host buffer at %#x was not allocated here", b.Addr)
	}
	delete(d.host, b.Addr)
	var err error
	if b.Kind == gpubench.HostPinned {
		if r := C.kcu_unregister(d.k, d.ctx[0], C.uint64_t(b.Addr)); r != 0 {
			err = d.err("cuMemHostUnregister", r)
		}
	}
	if ferr := reg.Free(); err == nil {
		err = ferr
	}
	return err
}

// NewStream implements gpubench.Driver.
func (d *Driver) NewStream(dev int) (gpubench.Stream, error) {
	ctx, err := d.ctxOf(dev)
	if err != nil {
		return gpubench.Stream{}, err
	}
	var s C.uint64_t
	if r := C.kcu_stream(d.k, ctx, &s); r != 0 {
		return gpubench.Stream{}, d.err("cuStreamCreate", r)
	}
	return gpubench.Stream{Device: dev, Handle: uint64(s)}, nil
}

// DestroyStream implements gpubench.Driver.
func (d *Driver) DestroyStream(s gpubench.Stream) error {
	ctx, err := d.ctxOf(s.Device)
	if err != nil {
		return err
	}
	if r := C.kcu_stream_destroy(d.k, ctx, C.uint64_t(s.Handle)); r != 0 {
		return d.err("cuStreamDestroy", r)
	}
	return nil
}

// NewEvent implements gpubench.Driver.
func (d *Driver) NewEvent(dev int) (gpubench.Event, error) {
	ctx, err := d.ctxOf(dev)
	if err != nil {
		return gpubench.Event{}, err
	}
	var e C.uint64_t
	if r := C.kcu_event(d.k, ctx, &e); r != 0 {
		return gpubench.Event{}, d.err("cuEventCreate", r)
	}
	return gpubench.Event{Device: dev, Handle: uint64(e)}, nil
}

// DestroyEvent implements gpubench.Driver.
func (d *Driver) DestroyEvent(e gpubench.Event) error {
	ctx, err := d.ctxOf(e.Device)
	if err != nil {
		return err
	}
	if r := C.kcu_event_destroy(d.k, ctx, C.uint64_t(e.Handle)); r != 0 {
		return d.err("cuEventDestroy", r)
	}
	return nil
}

// Copy implements gpubench.Driver: host to device and back with
// cuMemcpyHtoDAsync / DtoHAsync, within a device with DtoDAsync, between
// devices with cuMemcpyPeerAsync (direct where peer access is on, staged
// by the driver otherwise).
func (d *Driver) Copy(dst, src gpubench.Buffer, bytes int64, s gpubench.Stream) error {
	ctx, err := d.ctxOf(s.Device)
	if err != nil {
		return err
	}
	n := C.size_t(bytes)
	sh := C.uint64_t(s.Handle)
	dstDev, srcDev := dst.Kind == gpubench.DeviceMemory, src.Kind == gpubench.DeviceMemory
	var r C.kcu_r
	switch {
	case dstDev && !srcDev:
		r = C.kcu_h2d(d.k, ctx, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, sh)
		err = d.check("cuMemcpyHtoDAsync", r)
	case !dstDev && srcDev:
		r = C.kcu_d2h(d.k, ctx, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, sh)
		err = d.check("cuMemcpyDtoHAsync", r)
	case dstDev && srcDev && dst.Device == src.Device:
		r = C.kcu_d2d(d.k, ctx, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, sh)
		err = d.check("cuMemcpyDtoDAsync", r)
	case dstDev && srcDev:
		dctx, err1 := d.ctxOf(dst.Device)
		sctx, err2 := d.ctxOf(src.Device)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("peer copy between CUDA devices %d and %d: no such device", src.Device, dst.Device)
		}
		r = C.kcu_peer(d.k, ctx, C.uint64_t(dst.Addr), dctx, C.uint64_t(src.Addr), sctx, n, sh)
		err = d.check("cuMemcpyPeerAsync", r)
	default:
		return fmt.Errorf("a copy from host memory to host memory is not a GPU test")
	}
	return err
}

func (d *Driver) check(call string, r C.kcu_r) error {
	if r == 0 {
		return nil
	}
	return d.err(call, r)
}

// Record implements gpubench.Driver.
func (d *Driver) Record(e gpubench.Event, s gpubench.Stream) error {
	ctx, err := d.ctxOf(s.Device)
	if err != nil {
		return err
	}
	return d.check("cuEventRecord", C.kcu_record(d.k, ctx, C.uint64_t(e.Handle), C.uint64_t(s.Handle)))
}

// Wait implements gpubench.Driver.
func (d *Driver) Wait(s gpubench.Stream, e gpubench.Event) error {
	ctx, err := d.ctxOf(s.Device)
	if err != nil {
		return err
	}
	return d.check("cuStreamWaitEvent", C.kcu_wait(d.k, ctx, C.uint64_t(s.Handle), C.uint64_t(e.Handle)))
}

// Sync implements gpubench.Driver.
func (d *Driver) Sync(e gpubench.Event) error {
	ctx, err := d.ctxOf(e.Device)
	if err != nil {
		return err
	}
	return d.check("cuEventSynchronize", C.kcu_sync(d.k, ctx, C.uint64_t(e.Handle)))
}

// Elapsed implements gpubench.Driver (cuEventElapsedTime, milliseconds
// with a resolution of about half a microsecond).
func (d *Driver) Elapsed(start, end gpubench.Event) (time.Duration, error) {
	ctx, err := d.ctxOf(start.Device)
	if err != nil {
		return 0, err
	}
	var ms C.float
	if r := C.kcu_elapsed(d.k, ctx, C.uint64_t(start.Handle), C.uint64_t(end.Handle), &ms); r != 0 {
		return 0, d.err("cuEventElapsedTime", r)
	}
	return time.Duration(math.Round(float64(ms) * float64(time.Millisecond))), nil
}

// CanAccessPeer implements gpubench.Driver.
func (d *Driver) CanAccessPeer(dev, peer int) (bool, error) {
	if _, err := d.ctxOf(dev); err != nil {
		return false, err
	}
	if _, err := d.ctxOf(peer); err != nil {
		return false, err
	}
	var ok C.int
	if r := C.kcu_can_peer(d.k, d.cudev[dev], d.cudev[peer], &ok); r != 0 {
		return false, d.err("cuDeviceCanAccessPeer", r)
	}
	return ok != 0, nil
}

// EnablePeerAccess implements gpubench.Driver.
func (d *Driver) EnablePeerAccess(dev, peer int) error {
	ctx, err := d.ctxOf(dev)
	if err != nil {
		return err
	}
	pctx, err := d.ctxOf(peer)
	if err != nil {
		return err
	}
	r := C.kcu_enable_peer(d.k, ctx, pctx)
	if r == cudaErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return d.check("cuCtxEnablePeerAccess", r)
}

// Gate implements gpubench.Gater with cuLaunchHostFunc.
func (d *Driver) Gate(s gpubench.Stream) (func() error, error) {
	if C.kcu_has_gate(d.k) == 0 {
		return nil, errors.New("this CUDA driver has no cuLaunchHostFunc")
	}
	ctx, err := d.ctxOf(s.Device)
	if err != nil {
		return nil, err
	}
	var h C.uint64_t
	if r := C.kcu_gate(d.k, ctx, C.uint64_t(s.Handle), &h); r != 0 {
		return nil, d.err("cuLaunchHostFunc", r)
	}
	return func() error {
		C.kcu_open_gate(h)
		return nil
	}, nil
}

// Close releases the primary contexts. The library stays loaded: the
// CUDA driver keeps threads of its own that unloading it would pull the
// code from under.
func (d *Driver) Close() error {
	if d.k == nil {
		return nil
	}
	var first error
	for addr, reg := range d.host {
		if err := reg.Free(); err != nil && first == nil {
			first = err
		}
		delete(d.host, addr)
	}
	for i, dev := range d.cudev {
		if r := C.kcu_release(d.k, dev); r != 0 && first == nil {
			first = fmt.Errorf("CUDA device %d: %w", i, d.err("cuDevicePrimaryCtxRelease", r))
		}
	}
	d.cudev, d.ctx = nil, nil
	return first
}

// Path is the library loaded.
func (d *Driver) Path() string { return d.path }
