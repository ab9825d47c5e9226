/* Stand-in for NCCL (libnccl.so.2): the real names and signatures (nccl.h).
 * Like the real library, each public ncclX is a weak alias of pncclX (the
 * profiling interface), so both names share one address. ncclUniqueId goes by
 * value (128 bytes, on the stack): in ncclCommInitRank the rank is the third
 * integer register. With NCCL_STANDIN_BARRIER=1, collectives wait for every
 * rank of the communicator like the real ones: ranks in different processes
 * meet through a small shared file in /dev/shm named after the first 8 bytes
 * of the ncclUniqueId (an arrival counter), so a rank that enters late holds
 * the others back. Delay: NCCL_STANDIN_US (inside each
 * collective, after all ranks arrived). */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "standin.h"

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
struct ncclComm {
    int nranks;
    int rank;
    ncclUniqueId id;
    unsigned long seq;          /* collectives this rank made on the communicator */
    volatile long *arrivals;    /* shared by the ranks: total arrivals at collectives */
};
typedef struct ncclComm *ncclComm_t;
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; } ncclConfig_t;

#ifdef NCCL_ID_BY_REFERENCE
/* How an arm64 (AAPCS64) caller passes the 128-byte ncclUniqueId: a pointer to a copy it made, in
 * the argument's own register. Built with -DNCCL_ID_BY_REFERENCE on x86-64 (build/byref/), the
 * pointer lands in rdx and the rank in ecx: arm64's layout (x2, x3), so the agent's arm64 decoding
 * (OTELBPF_NCCL_ID_ABI=aarch64) runs on real probes here. */
#define UNIQUE_ID_PARAM const ncclUniqueId *commIdRef
#define UNIQUE_ID (*commIdRef)
#define UNIQUE_ID_ARG commIdRef
#else
#define UNIQUE_ID_PARAM ncclUniqueId commId
#define UNIQUE_ID commId
#define UNIQUE_ID_ARG commId
#endif

#define NCCL_API(ret, name, ...) \
    __attribute__((weak, alias("p" #name))) ret name(__VA_ARGS__); \
    __attribute__((visibility("default"))) ret p##name(__VA_ARGS__)

/* The arrival counter shared by the ranks of the communicator `id` (NULL: none, run alone). */
static volatile long *shared_arrivals(const ncclUniqueId *id)
{
    char path[96];
    const unsigned char *b = (const unsigned char *)id->internal; /* the first 8 bytes, in order */
    snprintf(path, sizeof(path), "/dev/shm/nccl-standin-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7]);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, 4096) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : (volatile long *)p;
}

/* Wait until every rank has arrived at this collective, then take NCCL_STANDIN_US. */
static void collective(ncclComm_t comm)
{
    if (comm && comm->arrivals && comm->nranks > 1) {
        comm->seq++;
        long want = (long)comm->seq * comm->nranks;
        __atomic_add_fetch(comm->arrivals, 1, __ATOMIC_SEQ_CST);
        struct timespec pause = {0, 50000};
        while (__atomic_load_n(comm->arrivals, __ATOMIC_SEQ_CST) < want)
            nanosleep(&pause, NULL);
    }
    standin_delay("NCCL_STANDIN_US");
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        uniqueId->internal[i] = (char)(rand() & 0xff);
    return 0;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, UNIQUE_ID_PARAM, int rank)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (!c || rank < 0 || rank >= nranks)
        return 4; /* ncclInvalidArgument */
    c->nranks = nranks;
    c->rank = rank;
    c->id = UNIQUE_ID;
    const char *barrier = getenv("NCCL_STANDIN_BARRIER");
    c->arrivals = nranks > 1 && barrier && *barrier == '1' ? shared_arrivals(&c->id) : NULL;
    *comm = c;
    return 0;
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, UNIQUE_ID_PARAM, int rank,
         ncclConfig_t *config)
{
    (void)config;
    return pncclCommInitRank(comm, nranks, UNIQUE_ID_ARG, rank);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (comm && comm->arrivals)
        munmap((void *)comm->arrivals, 4096);
    free(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)stream;
    collective(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)stream;
    collective(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)stream;
    collective(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)stream;
    collective(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    (void)recvbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective(comm);
    return 0;
}
