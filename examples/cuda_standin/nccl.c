/* Stand-in for NCCL (libnccl.so.2): the real names and signatures (nccl.h).
 * Like the real library, each public ncclX is a weak alias of pncclX (the
 * profiling interface), so both names share one address. ncclUniqueId goes by
 * value (128 bytes, on the stack): in ncclCommInitRank the rank is the third
 * integer register. Delay: NCCL_STANDIN_US (collectives; NCCL_STANDIN_RANK_US
 * adds to it when the rank equals NCCL_STANDIN_SLOW_RANK). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "standin.h"

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
struct ncclComm { int nranks; int rank; ncclUniqueId id; };
typedef struct ncclComm *ncclComm_t;
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; } ncclConfig_t;

#define NCCL_API(ret, name, ...) \
    __attribute__((weak, alias("p" #name))) ret name(__VA_ARGS__); \
    __attribute__((visibility("default"))) ret p##name(__VA_ARGS__)

static void collective_delay(ncclComm_t comm)
{
    standin_delay("NCCL_STANDIN_US");
    const char *slow = getenv("NCCL_STANDIN_SLOW_RANK");
    if (slow && comm && atoi(slow) == comm->rank)
        standin_delay("NCCL_STANDIN_RANK_US");
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        uniqueId->internal[i] = (char)(rand() & 0xff);
    return 0;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (!c || rank < 0 || rank >= nranks)
        return 4; /* ncclInvalidArgument */
    c->nranks = nranks;
    c->rank = rank;
    c->id = commId;
    *comm = c;
    return 0;
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config)
{
    (void)config;
    return pncclCommInitRank(comm, nranks, commId, rank);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    free(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)stream;
    collective_delay(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)stream;
    collective_delay(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)stream;
    collective_delay(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)stream;
    collective_delay(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective_delay(comm);
    return 0;
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    (void)recvbuff; (void)count; (void)datatype; (void)peer; (void)stream;
    collective_delay(comm);
    return 0;
}
