/*
 * A fake NCCL for kiln's tests, linked into one library with the fake
 * libcuda (gpubench/cudadrv/testdata/fakecuda.c), whose streams it moves
 * on: an operation takes 2 us plus its size (the buffer for all-reduce,
 * the whole gathered or scattered buffer otherwise) at 100 GB/s on every
 * rank's stream. Launches outside a group are refused, as are data types
 * other than float32 and reductions other than sum.
 */
#include <stdint.h>
#include <stdlib.h>

typedef int ncclResult_t;
struct stream { int dev; double clock; }; /* as in fakecuda.c */
struct comm { int rank, nranks, dev; };

static int depth;

ncclResult_t ncclGetVersion(int *v) { *v = 22105; return 0; }
ncclResult_t ncclCommInitAll(void **comms, int n, const int *devs) {
	for (int i = 0; i < n; i++) {
		struct comm *c = malloc(sizeof *c);
		c->rank = i;
		c->nranks = n;
		c->dev = devs[i];
		comms[i] = c;
	}
	return 0;
}
ncclResult_t ncclCommDestroy(void *c) { free(c); return 0; }
ncclResult_t ncclGroupStart(void) { depth++; return 0; }
ncclResult_t ncclGroupEnd(void) { if (depth == 0) return 5; depth--; return 0; }

static ncclResult_t run(size_t bytes, int type, void *comm, void *s) {
	struct comm *c = comm;
	struct stream *st = s;
	if (!depth || type != 7) return 4; /* ncclInvalidArgument */
	if (st->dev != c->dev) return 5;   /* ncclInvalidUsage */
	st->clock += 2000 + (double)bytes / 100;
	return 0;
}
ncclResult_t ncclAllReduce(const void *a, void *b, size_t count, int type, int op, void *comm, void *s) {
	(void)a; (void)b;
	if (op != 0) return 4;
	return run(count * 4, type, comm, s);
}
ncclResult_t ncclAllGather(const void *a, void *b, size_t count, int type, void *comm, void *s) {
	(void)a; (void)b;
	return run(count * 4 * ((struct comm *)comm)->nranks, type, comm, s);
}
ncclResult_t ncclReduceScatter(const void *a, void *b, size_t count, int type, int op, void *comm, void *s) {
	(void)a; (void)b;
	if (op != 0) return 4;
	return run(count * 4 * ((struct comm *)comm)->nranks, type, comm, s);
}
const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case 5: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	}
	return "unhandled error";
}
