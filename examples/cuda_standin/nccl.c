/* Stand-in for NCCL (libnccl.so.2): the real names and signatures (nccl.h).
 * Like the real library, each public ncclX is a weak alias of pncclX (the
 * profiling interface), so both names share one address, and its read-only
 * data carries NCCL's version banner ("NCCL version 2.28.9+cuda12.4";
 * STANDIN_VERSION at build time), which is how a reader of the file tells the
 * version. ncclUniqueId goes by value (128 bytes, on the stack): in
 * ncclCommInitRank the rank is the third integer register.
 *
 * With NCCL_STANDIN_BARRIER=1, collectives wait for every rank of the
 * communicator like the real ones: ranks in different processes (and network
 * namespaces: the file system is what they share) meet through a small shared
 * file in /dev/shm named after the first 8 bytes of the ncclUniqueId (an
 * arrival counter), so a rank that enters late holds the others back. Delay:
 * NCCL_STANDIN_US (inside each collective, after all ranks arrived: a rank
 * with a larger one has a slower collective).
 *
 * The same file keeps, per rank, what NCCL's RAS gathers from each process
 * (src/ras/collectives.cc): its pid, its node's address (NCCL_STANDIN_HOST),
 * its status, and how many collectives of each function it launched (counted
 * at entry, as NCCL counts at kernel-plan launch; send/recv are not counted),
 * under the communicator's commHash, computed from the 128-byte id the way
 * this NCCL version does. examples/nccl_ras_standin.py answers RAS queries
 * from these files. Layout: struct standin_shared below (the Python reader
 * mirrors it).
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "standin.h"

#ifndef STANDIN_VERSION
#define STANDIN_VERSION "2.28.9"
#endif
#ifndef STANDIN_VERSION_CODE /* major * 10000 + minor * 100 + patch */
#define STANDIN_VERSION_CODE 22809
#endif
/* Kept whole in .rodata, as NCCL keeps its VERSION_STRING. */
__attribute__((used, visibility("default"))) const char ncclStandinVersionBanner[] =
    "NCCL version " STANDIN_VERSION "+cuda12.4";

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

/* ncclFunc_t order, the keys of RAS's per-function counts */
enum { FUNC_BROADCAST = 0, FUNC_REDUCE = 1, FUNC_ALLGATHER = 2, FUNC_REDUCESCATTER = 3, FUNC_ALLREDUCE = 4,
       FUNC_COUNT = 5, FUNC_NONE = -1 };
enum { STATUS_ABSENT = 0, STATUS_RUNNING = 1, STATUS_FINALIZE = 2 };

#define STANDIN_MAX_RANKS 64
#define STANDIN_SHARED_BYTES 16384
#define STANDIN_MAGIC 0x4e49545344434e4eULL /* "NNCDSTIN" */

struct standin_rank {           /* 128 bytes */
    int32_t pid;                /* 0: this rank has not joined */
    int32_t status;             /* STATUS_* */
    uint64_t counts[FUNC_COUNT]; /* collectives launched, per function */
    char host[48];              /* NCCL_STANDIN_HOST: the rank's node address */
    int32_t cuda_dev;
    int32_t pad;
    uint64_t reserved[3];
};

struct standin_shared {
    int64_t arrivals;           /* arrivals at collectives, every rank, for the barrier */
    uint64_t magic;             /* STANDIN_MAGIC once a rank initialised the file */
    uint64_t comm_hash;         /* the communicator's commHash */
    int32_t nranks;
    int32_t version;            /* STANDIN_VERSION_CODE */
    uint8_t pad[32];
    struct standin_rank ranks[STANDIN_MAX_RANKS];
};

struct ncclComm {
    int nranks;
    int rank;
    ncclUniqueId id;
    unsigned long seq;              /* collectives this rank made on the communicator */
    struct standin_shared *shared;  /* NULL: no barrier, run alone */
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

/* -- commHash: what NCCL derives from the id bytes, per version ------------------------------ */

/* NCCL 2.19-2.25: DJB2a over the bytes as `char` (signed on x86-64, unsigned on arm64). */
static uint64_t hash_djb2a(const char *bytes, size_t n)
{
    uint64_t h = 5381;
    for (size_t i = 0; i < n; i++)
        h = (h * 33) ^ (uint64_t)(int64_t)bytes[i];
    return h;
}

/* NCCL >= 2.26: a two-word accumulator fed 8 bytes at a time (little-endian), then folded. */
static uint64_t hash_accumulated(const unsigned char *bytes, size_t n)
{
    uint64_t a = 1 ^ (uint64_t)n, b = 1;
    for (size_t done = 0; done < n; done += 8) {
        a += b;
        b ^= a;
        a ^= a >> 31;
        a *= 0x9de62bbc8cef3ce3ULL;
        b ^= b >> 32;
        b *= 0x485cd6311b599e79ULL;
        uint64_t word = 0;
        memcpy(&word, bytes + done, n - done < 8 ? n - done : 8);
        a += word;
    }
    uint64_t h = a;
    h ^= h >> 31;
    h *= 0xbac3bd562846de6bULL;
    h += b;
    h ^= h >> 32;
    return h * 0x995a187a14e7b445ULL;
}

/* The commHash of `id` as NCCL `version` (major * 10000 + minor * 100 + patch) computes it.
 * Exported for the tests, which compare the agent's Python with it. */
__attribute__((visibility("default"))) uint64_t ncclStandinCommHash(const ncclUniqueId *id, int version)
{
    if (version >= 22600)
        return hash_accumulated((const unsigned char *)id->internal, NCCL_UNIQUE_ID_BYTES);
    return hash_djb2a(id->internal, NCCL_UNIQUE_ID_BYTES);
}

/* -- the shared file ------------------------------------------------------------------------- */

/* The file shared by the ranks of the communicator `id` (NULL: none, run alone). */
static struct standin_shared *shared_file(const ncclUniqueId *id)
{
    char path[96];
    const unsigned char *b = (const unsigned char *)id->internal; /* the first 8 bytes, in order */
    snprintf(path, sizeof(path), "/dev/shm/nccl-standin-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7]);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, STANDIN_SHARED_BYTES) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, STANDIN_SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : (struct standin_shared *)p;
}

static struct standin_rank *my_rank(ncclComm_t comm)
{
    if (!comm || !comm->shared || comm->rank >= STANDIN_MAX_RANKS)
        return NULL;
    return &comm->shared->ranks[comm->rank];
}

/* Count the launch (as NCCL does, so RAS sees it), wait until every rank has arrived at this
 * collective, then take NCCL_STANDIN_US. */
static void collective(ncclComm_t comm, int func)
{
    struct standin_rank *me = my_rank(comm);
    if (me && func != FUNC_NONE)
        __atomic_add_fetch(&me->counts[func], 1, __ATOMIC_SEQ_CST);
    if (comm && comm->shared && comm->nranks > 1) {
        comm->seq++;
        long want = (long)comm->seq * comm->nranks;
        __atomic_add_fetch(&comm->shared->arrivals, 1, __ATOMIC_SEQ_CST);
        struct timespec pause = {0, 50000};
        while (__atomic_load_n(&comm->shared->arrivals, __ATOMIC_SEQ_CST) < want)
            nanosleep(&pause, NULL);
    }
    standin_delay("NCCL_STANDIN_US");
}

NCCL_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (!version)
        return 4;
    *version = STANDIN_VERSION_CODE;
    return 0;
}

/* Like NCCL's bootstrap handle: a random magic, then the root's socket address (127.0.0.1 here),
 * zeros after. */
NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return 4;
    memset(uniqueId, 0, sizeof(*uniqueId));
    uint64_t magic = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &magic, sizeof(magic)) != (ssize_t)sizeof(magic)) {
        if (fd >= 0)
            close(fd);
        return 2; /* ncclSystemError */
    }
    close(fd);
    unsigned char address[16] = {2, 0, (unsigned char)(magic >> 8), (unsigned char)magic, 127, 0, 0, 1};
    memcpy(uniqueId->internal, &magic, sizeof(magic));
    memcpy(uniqueId->internal + 8, address, sizeof(address));
    return 0;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, UNIQUE_ID_PARAM, int rank)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (!c || rank < 0 || rank >= nranks) {
        free(c);
        return 4; /* ncclInvalidArgument */
    }
    c->nranks = nranks;
    c->rank = rank;
    c->id = UNIQUE_ID;
    const char *barrier = getenv("NCCL_STANDIN_BARRIER");
    c->shared = nranks > 1 && barrier && *barrier == '1' ? shared_file(&c->id) : NULL;
    if (c->shared) {
        c->shared->comm_hash = ncclStandinCommHash(&c->id, STANDIN_VERSION_CODE);
        c->shared->nranks = nranks;
        c->shared->version = STANDIN_VERSION_CODE;
        __atomic_store_n(&c->shared->magic, STANDIN_MAGIC, __ATOMIC_SEQ_CST);
        struct standin_rank *me = my_rank(c);
        if (me) {
            const char *host = getenv("NCCL_STANDIN_HOST");
            snprintf(me->host, sizeof(me->host), "%s", host && *host ? host : "127.0.0.1");
            me->cuda_dev = rank;
            me->status = STATUS_RUNNING;
            __atomic_store_n(&me->pid, (int32_t)getpid(), __ATOMIC_SEQ_CST);
        }
    }
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
    struct standin_rank *me = my_rank(comm);
    if (me)
        me->status = STATUS_FINALIZE;
    if (comm && comm->shared)
        munmap((void *)comm->shared, STANDIN_SHARED_BYTES);
    free(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)stream;
    collective(comm, FUNC_ALLREDUCE);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)stream;
    collective(comm, FUNC_ALLGATHER);
    return 0;
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)stream;
    collective(comm, FUNC_REDUCESCATTER);
    return 0;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)stream;
    collective(comm, FUNC_BROADCAST);
    return 0;
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective(comm, FUNC_NONE);
    return 0;
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    (void)recvbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective(comm, FUNC_NONE);
    return 0;
}
