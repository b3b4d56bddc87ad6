/*
 * A fake CUDA driver library for kiln's tests: it exports the libcuda
 * symbols gpubench/cudadrv loads and simulates time. Each stream has a
 * clock; a copy moves it on by its size over a fixed rate, an event takes
 * its stream's clock when recorded, a stream waiting for an event takes
 * the event's time if later. Copies are real memcpy calls between host
 * memory and malloc'd "device" memory, so wrong addresses crash the test.
 *
 * Every copy costs 1 us, plus its size at a rate (GB/s): host to device
 * from pinned memory 25, device to host 20, pageable either way 10,
 * within a device 500, device to device 50.
 * FAKECUDA_DEVICES sets the GPU count (default 2); FAKECUDA_NODEVICE=1
 * makes cuInit fail with CUDA_ERROR_NO_DEVICE.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

enum { MAXDEV = 8, MAXREG = 64 };

struct ctx { int dev; int peer[MAXDEV]; };
struct stream { int dev; double clock; };
struct event { int dev; double t; int recorded; };

static struct ctx ctxs[MAXDEV];
static int ndev = 2;
static int inited;
static __thread struct ctx *current;
static void *registered[MAXREG];
static size_t reglen[MAXREG];

static int pinned(const void *p) {
	for (int i = 0; i < MAXREG; i++) {
		const char *b = registered[i];
		if (b && (const char *)p >= b && (const char *)p < b + reglen[i]) return 1;
	}
	return 0;
}

CUresult cuInit(unsigned flags) {
	(void)flags;
	const char *e = getenv("FAKECUDA_NODEVICE");
	if (e && strcmp(e, "1") == 0) return 100;
	e = getenv("FAKECUDA_DEVICES");
	if (e) ndev = atoi(e);
	if (ndev < 0 || ndev > MAXDEV) ndev = 2;
	for (int i = 0; i < MAXDEV; i++) ctxs[i].dev = i;
	inited = 1;
	return 0;
}
CUresult cuDriverGetVersion(int *v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return 3; *n = ndev; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal < 0 || ordinal >= ndev) return 101; *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { snprintf(name, len, "Fake CUDA GPU %d", d); return 0; }
CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice d) { snprintf(bus, len, "0000:%02X:00.0", 0x1a + d * 0x10); return 0; }
CUresult cuDeviceTotalMem_v2(size_t *m, CUdevice d) { (void)d; *m = (size_t)80 << 30; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, CUdevice d) { *c = &ctxs[d]; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return 0; }
CUresult cuCtxSetCurrent(void *c) { current = c; return 0; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	if (!current) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	void *m = malloc(n);
	if (!m) return 2;
	*p = (CUdeviceptr)(uintptr_t)m;
	return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
	if (flags != 1) return 1; /* kiln registers portable memory */
	for (int i = 0; i < MAXREG; i++) if (!registered[i]) { registered[i] = p; reglen[i] = n; return 0; }
	return 2;
}
CUresult cuMemHostUnregister(void *p) {
	for (int i = 0; i < MAXREG; i++) if (registered[i] == p) { registered[i] = NULL; return 0; }
	return 712; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
}

static CUresult advance(void *s, size_t n, double gbps) {
	struct stream *st = s;
	if (!st || !current || current->dev != st->dev) return 201;
	st->clock += 1000 + (double)n / gbps; /* ns */
	return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
	memcpy((void *)(uintptr_t)d, h, n);
	return advance(s, n, pinned(h) ? 25 : 10);
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
	memcpy(h, (void *)(uintptr_t)d, n);
	return advance(s, n, pinned(h) ? 20 : 10);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, void *s) {
	memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)src, n);
	return advance(s, n, 500);
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, void *dctx, CUdeviceptr src, void *sctx, size_t n, void *s) {
	if (dctx == sctx) return 1;
	memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)src, n);
	return advance(s, n, 50);
}
CUresult cuStreamCreate(void **s, unsigned flags) {
	if (!current || flags != 1) return 1;
	struct stream *st = calloc(1, sizeof *st);
	st->dev = current->dev;
	*s = st;
	return 0;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
	struct stream *st = s;
	struct event *ev = e;
	if (flags || !ev->recorded) return 1;
	if (ev->t > st->clock) st->clock = ev->t;
	return 0;
}
CUresult cuEventCreate(void **e, unsigned flags) {
	if (!current || flags) return 1;
	struct event *ev = calloc(1, sizeof *ev);
	ev->dev = current->dev;
	*e = ev;
	return 0;
}
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, void *s) {
	struct event *ev = e;
	struct stream *st = s;
	if (ev->dev != st->dev) return 400; /* CUDA_ERROR_INVALID_HANDLE */
	ev->t = st->clock;
	ev->recorded = 1;
	return 0;
}
/* Host functions run on threads of their own, as the driver's do; an
 * event synchronisation joins them (a host function that never returns
 * fails it after 5 s instead of hanging the test). */
struct hostfn { void (*fn)(void *); void *data; };
static pthread_t hostthreads[256];
static int nhost;
static pthread_mutex_t hostmu = PTHREAD_MUTEX_INITIALIZER;
static void *hostrun(void *p) { struct hostfn *h = p; h->fn(h->data); free(h); return NULL; }
CUresult cuLaunchHostFunc(void *s, void (*fn)(void *), void *data) {
	(void)s;
	struct hostfn *h = malloc(sizeof *h);
	h->fn = fn;
	h->data = data;
	pthread_mutex_lock(&hostmu);
	if (nhost == 256 || pthread_create(&hostthreads[nhost], NULL, hostrun, h)) { pthread_mutex_unlock(&hostmu); free(h); return 2; }
	nhost++;
	pthread_mutex_unlock(&hostmu);
	return 0;
}
static int joinhost(void) {
	pthread_mutex_lock(&hostmu);
	int bad = 0;
	for (int i = 0; i < nhost; i++) {
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_sec += 5;
		if (pthread_timedjoin_np(hostthreads[i], NULL, &t)) bad = 1;
	}
	nhost = 0;
	pthread_mutex_unlock(&hostmu);
	return bad;
}
CUresult cuEventSynchronize(void *e) { if (joinhost()) return 999; return ((struct event *)e)->recorded ? 0 : 600; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
	struct event *x = a, *y = b;
	if (!x->recorded || !y->recorded) return 600;
	if (x->dev != y->dev) return 400;
	*ms = (float)((y->t - x->t) / 1e6);
	return 0;
}
CUresult cuDeviceCanAccessPeer(int *ok, CUdevice a, CUdevice b) { *ok = a != b; return 0; }
CUresult cuCtxEnablePeerAccess(void *peer, unsigned flags) {
	struct ctx *p = peer;
	if (flags || !current || p == current) return 1;
	if (current->peer[p->dev]) return 704;
	current->peer[p->dev] = 1;
	return 0;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
	switch (r) {
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
	case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
	}
	*s = NULL;
	return 1;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
	switch (r) {
	case 100: *s = "no CUDA-capable device is detected"; return 0;
	case 2: *s = "out of memory"; return 0;
	}
	*s = NULL;
	return 1;
}
