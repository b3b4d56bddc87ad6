//go:build cgo

package hip

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// HIP's types as hip_runtime_api.h declares them: hipError_t and
// hipDevice_t are ints, streams and events opaque pointers. kiln does not
// include the header: the library is found at run time.
typedef int khip_r;

typedef struct {
	void *h;
	khip_r (*Init)(unsigned int);
	khip_r (*DriverGetVersion)(int *);
	khip_r (*GetDeviceCount)(int *);
	khip_r (*DeviceGet)(int *, int);
	khip_r (*DeviceGetName)(char *, int, int);
	khip_r (*DeviceGetPCIBusId)(char *, int, int);
	khip_r (*DeviceTotalMem)(size_t *, int);
	khip_r (*SetDevice)(int);
	khip_r (*Malloc)(void **, size_t);
	khip_r (*Free)(void *);
	khip_r (*HostRegister)(void *, size_t, unsigned int);
	khip_r (*HostUnregister)(void *);
	khip_r (*MemcpyAsync)(void *, const void *, size_t, int, void *);
	khip_r (*MemcpyPeerAsync)(void *, int, const void *, int, size_t, void *);
	khip_r (*StreamCreateWithFlags)(void **, unsigned int);
	khip_r (*StreamDestroy)(void *);
	khip_r (*StreamWaitEvent)(void *, void *, unsigned int);
	khip_r (*EventCreate)(void **);
	khip_r (*EventDestroy)(void *);
	khip_r (*EventRecord)(void *, void *);
	khip_r (*EventSynchronize)(void *);
	khip_r (*EventElapsedTime)(float *, void *, void *);
	khip_r (*DeviceCanAccessPeer)(int *, int, int);
	khip_r (*DeviceEnablePeerAccess)(int, unsigned int);
	const char *(*GetErrorName)(khip_r);
	const char *(*GetErrorString)(khip_r);
	// Optional.
	khip_r (*LaunchHostFunc)(void *, void (*)(void *), void *);
} khip;

static khip *khip_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	khip *k = calloc(1, sizeof *k);
	if (!k) {
		snprintf(err, errlen, "out of memory");
		dlclose(h);
		return NULL;
	}
	k->h = h;
#define SYM(field, name) do { *(void **)(&k->field) = dlsym(h, name); if (!k->field) { snprintf(err, errlen, "%s has no %s", path, name); free(k); dlclose(h); return NULL; } } while (0)
	SYM(Init, "hipInit");
	SYM(DriverGetVersion, "hipDriverGetVersion");
	SYM(GetDeviceCount, "hipGetDeviceCount");
	SYM(DeviceGet, "hipDeviceGet");
	SYM(DeviceGetName, "hipDeviceGetName");
	SYM(DeviceGetPCIBusId, "hipDeviceGetPCIBusId");
	SYM(DeviceTotalMem, "hipDeviceTotalMem");
	SYM(SetDevice, "hipSetDevice");
	SYM(Malloc, "hipMalloc");
	SYM(Free, "hipFree");
	SYM(HostRegister, "hipHostRegister");
	SYM(HostUnregister, "hipHostUnregister");
	SYM(MemcpyAsync, "hipMemcpyAsync");
	SYM(MemcpyPeerAsync, "hipMemcpyPeerAsync");
	SYM(StreamCreateWithFlags, "hipStreamCreateWithFlags");
	SYM(StreamDestroy, "hipStreamDestroy");
	SYM(StreamWaitEvent, "hipStreamWaitEvent");
	SYM(EventCreate, "hipEventCreate");
	SYM(EventDestroy, "hipEventDestroy");
	SYM(EventRecord, "hipEventRecord");
	SYM(EventSynchronize, "hipEventSynchronize");
	SYM(EventElapsedTime, "hipEventElapsedTime");
	SYM(DeviceCanAccessPeer, "hipDeviceCanAccessPeer");
	SYM(DeviceEnablePeerAccess, "hipDeviceEnablePeerAccess");
	SYM(GetErrorName, "hipGetErrorName");
	SYM(GetErrorString, "hipGetErrorString");
	*(void **)(&k->LaunchHostFunc) = dlsym(h, "hipLaunchHostFunc");
#undef SYM
	return k;
}

// Every call selects its device first, in the same C call: Go may run the
// next call on another thread, and HIP's current device is per thread.
#define DEV(dev) do { khip_r r_ = k->SetDevice(dev); if (r_) return r_; } while (0)

static khip_r khip_init(khip *k) { return k->Init(0); }
static khip_r khip_version(khip *k, int *v) { return k->DriverGetVersion(v); }
static khip_r khip_count(khip *k, int *n) { return k->GetDeviceCount(n); }
static khip_r khip_device(khip *k, int ordinal, char *name, int namelen, char *bus, int buslen, uint64_t *mem) {
	int dev = 0;
	khip_r r = k->DeviceGet(&dev, ordinal);
	if (r) return r;
	if ((r = k->DeviceGetName(name, namelen, dev))) return r;
	if ((r = k->DeviceGetPCIBusId(bus, buslen, ordinal))) return r;
	size_t m = 0;
	if ((r = k->DeviceTotalMem(&m, dev))) return r;
	*mem = m;
	return 0;
}
static khip_r khip_alloc(khip *k, int dev, size_t n, uint64_t *p) {
	DEV(dev);
	void *q = NULL;
	khip_r r = k->Malloc(&q, n);
	*p = (uint64_t)(uintptr_t)q;
	return r;
}
static khip_r khip_free(khip *k, int dev, uint64_t p) { DEV(dev); return k->Free((void *)(uintptr_t)p); }
// hipHostRegisterPortable: pinned for every device.
static khip_r khip_register(khip *k, uint64_t addr, size_t n) { return k->HostRegister((void *)(uintptr_t)addr, n, 0x1); }
static khip_r khip_unregister(khip *k, uint64_t addr) { return k->HostUnregister((void *)(uintptr_t)addr); }
// kind: hipMemcpyHostToDevice 1, DeviceToHost 2, DeviceToDevice 3.
static khip_r khip_copy(khip *k, int dev, uint64_t dst, uint64_t src, size_t n, int kind, uint64_t s) {
	DEV(dev);
	return k->MemcpyAsync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, kind, (void *)(uintptr_t)s);
}
static khip_r khip_peer(khip *k, int dev, uint64_t dst, int ddev, uint64_t src, int sdev, size_t n, uint64_t s) {
	DEV(dev);
	return k->MemcpyPeerAsync((void *)(uintptr_t)dst, ddev, (const void *)(uintptr_t)src, sdev, n, (void *)(uintptr_t)s);
}
// hipStreamNonBlocking.
static khip_r khip_stream(khip *k, int dev, uint64_t *s) {
	DEV(dev);
	void *p = NULL;
	khip_r r = k->StreamCreateWithFlags(&p, 0x1);
	*s = (uint64_t)(uintptr_t)p;
	return r;
}
static khip_r khip_stream_destroy(khip *k, int dev, uint64_t s) { DEV(dev); return k->StreamDestroy((void *)(uintptr_t)s); }
static khip_r khip_wait(khip *k, int dev, uint64_t s, uint64_t e) { DEV(dev); return k->StreamWaitEvent((void *)(uintptr_t)s, (void *)(uintptr_t)e, 0); }
static khip_r khip_event(khip *k, int dev, uint64_t *e) {
	DEV(dev);
	void *p = NULL;
	khip_r r = k->EventCreate(&p);
	*e = (uint64_t)(uintptr_t)p;
	return r;
}
static khip_r khip_event_destroy(khip *k, int dev, uint64_t e) { DEV(dev); return k->EventDestroy((void *)(uintptr_t)e); }
static khip_r khip_record(khip *k, int dev, uint64_t e, uint64_t s) { DEV(dev); return k->EventRecord((void *)(uintptr_t)e, (void *)(uintptr_t)s); }
static khip_r khip_sync(khip *k, int dev, uint64_t e) { DEV(dev); return k->EventSynchronize((void *)(uintptr_t)e); }
static khip_r khip_elapsed(khip *k, int dev, uint64_t a, uint64_t b, float *ms) { DEV(dev); return k->EventElapsedTime(ms, (void *)(uintptr_t)a, (void *)(uintptr_t)b); }
static khip_r khip_can_peer(khip *k, int dev, int peer, int *ok) { return k->DeviceCanAccessPeer(ok, dev, peer); }
static khip_r khip_enable_peer(khip *k, int dev, int peer) { DEV(dev); return k->DeviceEnablePeerAccess(peer, 0); }
// A gate: a host function that holds its stream until its flag is set
// (see gpubench/cudadrv); it frees the flag when it returns.
static void khip_gate_fn(void *p) {
	int *flag = p;
	while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) sched_yield();
	free(flag);
}
static int khip_has_gate(khip *k) { return k->LaunchHostFunc != NULL; }
static khip_r khip_gate(khip *k, int dev, uint64_t s, uint64_t *handle) {
	DEV(dev);
	int *flag = calloc(1, sizeof *flag);
	if (!flag) return 2;
	khip_r r = k->LaunchHostFunc((void *)(uintptr_t)s, khip_gate_fn, flag);
	if (r) { free(flag); return r; }
	*handle = (uint64_t)(uintptr_t)flag;
	return 0;
}
static void khip_open_gate(uint64_t handle) { __atomic_store_n((int *)(uintptr_t)handle, 1, __ATOMIC_RELEASE); }
static const char *khip_error(khip *k, khip_r r, int string) { return string ? k->GetErrorString(r) : k->GetErrorName(r); }
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

// HIP error codes kiln reads.
const (
	hipErrorInsufficientDriver       = 35
	hipErrorNoDevice                 = 100
	hipErrorPeerAccessAlreadyEnabled = 704
)

// Driver is the HIP runtime, loaded at run time.
type Driver struct {
	k       *C.khip
	path    string
	version int
	devs    []gpubench.Device
	sysRoot string
	host    map[uint64]*hostmem.Region
}

// Open loads libamdhip64 (the Libraries in turn when path is empty) and
// initialises it. A library that cannot be loaded and a machine without a
// HIP GPU give an error wrapping gpubench.ErrNoDriver.
func Open(path string) (*Driver, error) {
	paths := []string{path}
	if path == "" {
		paths = Libraries
	}
	var k *C.khip
	var reasons []string
	for _, p := range paths {
		cpath := C.CString(p)
		var errbuf [512]C.char
		k = C.khip_open(cpath, &errbuf[0], C.size_t(len(errbuf)))
		C.free(unsafe.Pointer(cpath))
		if k != nil {
			path = p
			break
		}
		reasons = append(reasons, C.GoString(&errbuf[0]))
	}
	if k == nil {
		return nil, gpubench.NoDriver(fmt.Errorf("cannot load HIP (is ROCm installed?): %s", gpubench.NotFound(paths, reasons)))
	}
	d := &Driver{k: k, path: path, sysRoot: "/", host: map[uint64]*hostmem.Region{}}
	if r := C.khip_init(k); r != 0 {
		err := d.err("hipInit", r)
		if r == hipErrorNoDevice || r == hipErrorInsufficientDriver {
			err = gpubench.NoDriver(err)
		}
		return nil, err
	}
	var v C.int
	if r := C.khip_version(k, &v); r == 0 {
		d.version = int(v)
	}
	var n C.int
	if r := C.khip_count(k, &n); r != 0 {
		err := d.err("hipGetDeviceCount", r)
		if r == hipErrorNoDevice {
			err = gpubench.NoDriver(err)
		}
		return nil, err
	}
	for i := range int(n) {
		var name [256]C.char
		var bus [64]C.char
		var mem C.uint64_t
		if r := C.khip_device(k, C.int(i), &name[0], C.int(len(name)), &bus[0], C.int(len(bus)), &mem); r != 0 {
			return nil, fmt.Errorf("HIP device %d: %w", i, d.err("hipDeviceGetName", r))
		}
		g := gpubench.Device{Ordinal: i, Name: C.GoString(&name[0]), MemoryBytes: uint64(mem)}
		if pci, err := snapshot.CanonicalPCI(C.GoString(&bus[0])); err == nil {
			g.PCI = pci
			g.NUMANode = hostmem.DeviceNode(d.sysRoot, pci)
		}
		d.devs = append(d.devs, g)
	}
	return d, nil
}

func (d *Driver) err(call string, r C.khip_r) error {
	name := C.GoString(C.khip_error(d.k, r, 0))
	text := C.GoString(C.khip_error(d.k, r, 1))
	if name == "" {
		name = fmt.Sprintf("HIP error %d", int(r))
	}
	if text != "" && !strings.EqualFold(text, name) {
		return fmt.Errorf("%s: %s (%s)", call, name, text)
	}
	return fmt.Errorf("%s: %s", call, name)
}

func (d *Driver) check(call string, r C.khip_r) error {
	if r == 0 {
		return nil
	}
	return d.err(call, r)
}

func (d *Driver) dev(i int) (C.int, error) {
	if i < 0 || i >= len(d.devs) {
		return 0, fmt.Errorf("HIP device %d does not exist (%d devices)", i, len(d.devs))
	}
	return C.int(i), nil
}

// Name implements gpubench.Driver.
func (d *Driver) Name() string { return "hip" }

// Version is the HIP driver's version ("6.1.40091").
func (d *Driver) Version() string { return versionText(d.version) }

// Devices implements gpubench.Driver.
func (d *Driver) Devices() ([]gpubench.Device, error) { return d.devs, nil }

// HostNUMANodes implements gpubench.Driver.
func (d *Driver) HostNUMANodes() []int {
	n, _ := hostmem.Nodes(d.sysRoot)
	return n
}

// AllocHost implements gpubench.Driver.
func (d *Driver) AllocHost(bytes int64, pinned bool, node int) (gpubench.Buffer, error) {
	r, err := hostmem.Alloc(bytes, node)
	if err != nil {
		return gpubench.Buffer{}, err
	}
	kind := gpubench.HostPageable
	if pinned {
		kind = gpubench.HostPinned
		if rc := C.khip_register(d.k, C.uint64_t(r.Addr()), C.size_t(bytes)); rc != 0 {
			_ = r.Free()
			return gpubench.Buffer{}, d.err("hipHostRegister", rc)
		}
	}
	b := gpubench.Buffer{Kind: kind, Device: -1, NUMANode: r.Node, Bytes: bytes, Addr: r.Addr()}
	d.host[b.Addr] = r
	return b, nil
}

// AllocDevice implements gpubench.Driver.
func (d *Driver) AllocDevice(dev int, bytes int64) (gpubench.Buffer, error) {
	cd, err := d.dev(dev)
	if err != nil {
		return gpubench.Buffer{}, err
	}
	var p C.uint64_t
	if r := C.khip_alloc(d.k, cd, C.size_t(bytes), &p); r != 0 {
		return gpubench.Buffer{}, d.err("hipMalloc", r)
	}
	return gpubench.Buffer{Kind: gpubench.DeviceMemory, Device: dev, NUMANode: gpubench.AnyNode, Bytes: bytes, Addr: uint64(p)}, nil
}

// Free implements gpubench.Driver.
func (d *Driver) Free(b gpubench.Buffer) error {
	if b.Kind == gpubench.DeviceMemory {
		cd, err := d.dev(b.Device)
		if err != nil {
			return err
		}
		return d.check("hipFree", C.khip_free(d.k, cd, C.uint64_t(b.Addr)))
	}
	reg := d.host[b.Addr]
	if reg == nil {
		return fmt.Errorf("host buffer at %#x was not allocated here", b.Addr)
	}
	delete(d.host, b.Addr)
	var err error
	if b.Kind == gpubench.HostPinned {
		err = d.check("hipHostUnregister", C.khip_unregister(d.k, C.uint64_t(b.Addr)))
	}
	return errors.Join(err, reg.Free())
}

// NewStream implements gpubench.Driver.
func (d *Driver) NewStream(dev int) (gpubench.Stream, error) {
	cd, err := d.dev(dev)
	if err != nil {
		return gpubench.Stream{}, err
	}
	var s C.uint64_t
	if r := C.khip_stream(d.k, cd, &s); r != 0 {
		return gpubench.Stream{}, d.err("hipStreamCreateWithFlags", r)
	}
	return gpubench.Stream{Device: dev, Handle: uint64(s)}, nil
}

// DestroyStream implements gpubench.Driver.
func (d *Driver) DestroyStream(s gpubench.Stream) error {
	cd, err := d.dev(s.Device)
	if err != nil {
		return err
	}
	return d.check("hipStreamDestroy", C.khip_stream_destroy(d.k, cd, C.uint64_t(s.Handle)))
}

// NewEvent implements gpubench.Driver.
func (d *Driver) NewEvent(dev int) (gpubench.Event, error) {
	cd, err := d.dev(dev)
	if err != nil {
		return gpubench.Event{}, err
	}
	var e C.uint64_t
	if r := C.khip_event(d.k, cd, &e); r != 0 {
		return gpubench.Event{}, d.err("hipEventCreate", r)
	}
	return gpubench.Event{Device: dev, Handle: uint64(e)}, nil
}

// DestroyEvent implements gpubench.Driver.
func (d *Driver) DestroyEvent(e gpubench.Event) error {
	cd, err := d.dev(e.Device)
	if err != nil {
		return err
	}
	return d.check("hipEventDestroy", C.khip_event_destroy(d.k, cd, C.uint64_t(e.Handle)))
}

// Copy implements gpubench.Driver.
func (d *Driver) Copy(dst, src gpubench.Buffer, bytes int64, s gpubench.Stream) error {
	cd, err := d.dev(s.Device)
	if err != nil {
		return err
	}
	n, sh := C.size_t(bytes), C.uint64_t(s.Handle)
	dstDev, srcDev := dst.Kind == gpubench.DeviceMemory, src.Kind == gpubench.DeviceMemory
	switch {
	case dstDev && !srcDev:
		return d.check("hipMemcpyAsync", C.khip_copy(d.k, cd, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, 1, sh))
	case !dstDev && srcDev:
		return d.check("hipMemcpyAsync", C.khip_copy(d.k, cd, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, 2, sh))
	case dstDev && srcDev && dst.Device == src.Device:
		return d.check("hipMemcpyAsync", C.khip_copy(d.k, cd, C.uint64_t(dst.Addr), C.uint64_t(src.Addr), n, 3, sh))
	case dstDev && srcDev:
		dd, err1 := d.dev(dst.Device)
		sd, err2 := d.dev(src.Device)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("peer copy between HIP devices %d and %d: no such device", src.Device, dst.Device)
		}
		return d.check("hipMemcpyPeerAsync", C.khip_peer(d.k, cd, C.uint64_t(dst.Addr), dd, C.uint64_t(src.Addr), sd, n, sh))
	}
	return fmt.Errorf("a copy from host memory to host memory is not a GPU test")
}

// Record implements gpubench.Driver.
func (d *Driver) Record(e gpubench.Event, s gpubench.Stream) error {
	cd, err := d.dev(s.Device)
	if err != nil {
		return err
	}
	return d.check("hipEventRecord", C.khip_record(d.k, cd, C.uint64_t(e.Handle), C.uint64_t(s.Handle)))
}

// Wait implements gpubench.Driver.
func (d *Driver) Wait(s gpubench.Stream, e gpubench.Event) error {
	cd, err := d.dev(s.Device)
	if err != nil {
		return err
	}
	return d.check("hipStreamWaitEvent", C.khip_wait(d.k, cd, C.uint64_t(s.Handle), C.uint64_t(e.Handle)))
}

// Sync implements gpubench.Driver.
func (d *Driver) Sync(e gpubench.Event) error {
	cd, err := d.dev(e.Device)
	if err != nil {
		return err
	}
	return d.check("hipEventSynchronize", C.khip_sync(d.k, cd, C.uint64_t(e.Handle)))
}

// Elapsed implements gpubench.Driver.
func (d *Driver) Elapsed(start, end gpubench.Event) (time.Duration, error) {
	cd, err := d.dev(start.Device)
	if err != nil {
		return 0, err
	}
	var ms C.float
	if r := C.khip_elapsed(d.k, cd, C.uint64_t(start.Handle), C.uint64_t(end.Handle), &ms); r != 0 {
		return 0, d.err("hipEventElapsedTime", r)
	}
	return time.Duration(math.Round(float64(ms) * float64(time.Millisecond))), nil
}

// CanAccessPeer implements gpubench.Driver.
func (d *Driver) CanAccessPeer(dev, peer int) (bool, error) {
	a, err := d.dev(dev)
	if err != nil {
		return false, err
	}
	b, err := d.dev(peer)
	if err != nil {
		return false, err
	}
	var ok C.int
	if r := C.khip_can_peer(d.k, a, b, &ok); r != 0 {
		return false, d.err("hipDeviceCanAccessPeer", r)
	}
	return ok != 0, nil
}

// EnablePeerAccess implements gpubench.Driver.
func (d *Driver) EnablePeerAccess(dev, peer int) error {
	a, err := d.dev(dev)
	if err != nil {
		return err
	}
	b, err := d.dev(peer)
	if err != nil {
		return err
	}
	r := C.khip_enable_peer(d.k, a, b)
	if r == hipErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return d.check("hipDeviceEnablePeerAccess", r)
}

// Gate implements gpubench.Gater with hipLaunchHostFunc.
func (d *Driver) Gate(s gpubench.Stream) (func() error, error) {
	if C.khip_has_gate(d.k) == 0 {
		return nil, errors.New("this HIP runtime has no hipLaunchHostFunc")
	}
	cd, err := d.dev(s.Device)
	if err != nil {
		return nil, err
	}
	var h C.uint64_t
	if r := C.khip_gate(d.k, cd, C.uint64_t(s.Handle), &h); r != 0 {
		return nil, d.err("hipLaunchHostFunc", r)
	}
	return func() error {
		C.khip_open_gate(h)
		return nil
	}, nil
}

// Close frees what is left of the host memory. The library stays loaded:
// the runtime keeps threads of its own.
func (d *Driver) Close() error {
	var errs []error
	for addr, reg := range d.host {
		errs = append(errs, reg.Free())
		delete(d.host, addr)
	}
	return errors.Join(errs...)
}

// Path is the library loaded.
func (d *Driver) Path() string { return d.path }
