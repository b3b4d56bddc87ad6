/*
 * A fake HIP runtime for kiln's tests: it exports the libamdhip64 symbols
 * gpubench/hip loads and simulates time. Each stream has a clock; a copy
 * moves it on by 1 us plus its size at a rate (GB/s: host to device from
 * pinned memory 24, device to host 16, pageable 8, within a device 800,
 * between devices 40), an event takes its stream's clock when recorded.
 * Copies are real memcpy calls, so wrong addresses crash the test. Peer
 * access is refused between devices 0 and 2 (FAKEHIP_DEVICES=3).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
enum { MAXDEV = 8, MAXREG = 64 };

struct stream { int dev; double clock; };
struct event { int dev; double t; int recorded; };

static int ndev = 2;
static __thread int current = -1;
static int peer[MAXDEV][MAXDEV];
static void *registered[MAXREG];
static size_t reglen[MAXREG];

static int pinned(const void *p) {
	for (int i = 0; i < MAXREG; i++) {
		const char *b = registered[i];
		if (b && (const char *)p >= b && (const char *)p < b + reglen[i]) return 1;
	}
	return 0;
}

hipError_t hipInit(unsigned flags) {
	(void)flags;
	const char *e = getenv("FAKEHIP_DEVICES");
	if (e) ndev = atoi(e);
	if (ndev < 0 || ndev > MAXDEV) ndev = 2;
	return ndev == 0 ? 100 : 0;
}
hipError_t hipDriverGetVersion(int *v) { *v = 60140091; return 0; }
hipError_t hipGetDeviceCount(int *n) { *n = ndev; return 0; }
hipError_t hipDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal >= ndev) return 101; *d = ordinal; return 0; }
hipError_t hipDeviceGetName(char *name, int len, int d) { snprintf(name, len, "Fake Instinct %d", d); return 0; }
hipError_t hipDeviceGetPCIBusId(char *bus, int len, int d) { snprintf(bus, len, "0000:%02x:00.0", 0x0c + d * 0x20); return 0; }
hipError_t hipDeviceTotalMem(size_t *m, int d) { (void)d; *m = (size_t)192 << 30; return 0; }
hipError_t hipSetDevice(int d) { if (d < 0 || d >= ndev) return 101; current = d; return 0; }
hipError_t hipMalloc(void **p, size_t n) { if (current < 0) return 709; *p = malloc(n); return *p ? 0 : 2; }
hipError_t hipFree(void *p) { free(p); return 0; }
hipError_t hipHostRegister(void *p, size_t n, unsigned flags) {
	if (flags != 1) return 1;
	for (int i = 0; i < MAXREG; i++) if (!registered[i]) { registered[i] = p; reglen[i] = n; return 0; }
	return 2;
}
hipError_t hipHostUnregister(void *p) {
	for (int i = 0; i < MAXREG; i++) if (registered[i] == p) { registered[i] = NULL; return 0; }
	return 713;
}
static hipError_t advance(void *s, size_t n, double gbps) {
	struct stream *st = s;
	if (!st || st->dev != current) return 709;
	st->clock += 1000 + (double)n / gbps;
	return 0;
}
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) {
	memcpy(dst, src, n);
	switch (kind) {
	case 1: return advance(s, n, pinned(src) ? 24 : 8);
	case 2: return advance(s, n, pinned(dst) ? 16 : 8);
	case 3: return advance(s, n, 800);
	}
	return 1;
}
hipError_t hipMemcpyPeerAsync(void *dst, int ddev, const void *src, int sdev, size_t n, void *s) {
	if (ddev == sdev || ddev < 0 || sdev < 0 || ddev >= ndev || sdev >= ndev) return 1;
	memcpy(dst, src, n);
	return advance(s, n, 40);
}
hipError_t hipStreamCreateWithFlags(void **s, unsigned flags) {
	if (current < 0 || flags != 1) return 1;
	struct stream *st = calloc(1, sizeof *st);
	st->dev = current;
	*s = st;
	return 0;
}
hipError_t hipStreamDestroy(void *s) { free(s); return 0; }
hipError_t hipStreamWaitEvent(void *s, void *e, unsigned flags) {
	struct stream *st = s;
	struct event *ev = e;
	if (flags || !ev->recorded) return 1;
	if (ev->t > st->clock) st->clock = ev->t;
	return 0;
}
hipError_t hipEventCreate(void **e) {
	if (current < 0) return 1;
	struct event *ev = calloc(1, sizeof *ev);
	ev->dev = current;
	*e = ev;
	return 0;
}
hipError_t hipEventDestroy(void *e) { free(e); return 0; }
hipError_t hipEventRecord(void *e, void *s) {
	struct event *ev = e;
	struct stream *st = s;
	if (ev->dev != st->dev) return 400;
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
hipError_t hipLaunchHostFunc(void *s, void (*fn)(void *), void *data) {
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
hipError_t hipEventSynchronize(void *e) { if (joinhost()) return 999; return ((struct event *)e)->recorded ? 0 : 600; }
hipError_t hipEventElapsedTime(float *ms, void *a, void *b) {
	struct event *x = a, *y = b;
	if (!x->recorded || !y->recorded || x->dev != y->dev) return 400;
	*ms = (float)((y->t - x->t) / 1e6);
	return 0;
}
hipError_t hipDeviceCanAccessPeer(int *ok, int a, int b) { *ok = a != b && !((a == 0 && b == 2) || (a == 2 && b == 0)); return 0; }
hipError_t hipDeviceEnablePeerAccess(int p, unsigned flags) {
	if (flags || current < 0 || p == current) return 1;
	if (peer[current][p]) return 704;
	peer[current][p] = 1;
	return 0;
}
const char *hipGetErrorName(hipError_t r) { return r == 100 ? "hipErrorNoDevice" : "hipErrorUnknown"; }
const char *hipGetErrorString(hipError_t r) { return r == 100 ? "no ROCm-capable device is detected" : "unknown error"; }
