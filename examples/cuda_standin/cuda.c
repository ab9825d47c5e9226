/* Stand-in for the CUDA driver (libcuda.so.1): the real entry points' names and
 * signatures (cuda.h), no GPU. "Device memory" is host memory from malloc, so
 * copies really copy. Delays: CUDA_STANDIN_SYNC_US (synchronisations),
 * CUDA_STANDIN_COPY_US (copies), CUDA_STANDIN_ALLOC_US (allocations). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "standin.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUgraphExec;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1

static volatile unsigned long launches; /* keeps the launch calls from being optimised away */

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)f; (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
    (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)kernelParams; (void)extra;
    launches++;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    (void)config; (void)f; (void)kernelParams; (void)extra;
    launches++;
    return CUDA_SUCCESS;
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
    (void)f; (void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
    (void)blockDimZ; (void)sharedMemBytes; (void)hStream; (void)kernelParams;
    launches++;
    return CUDA_SUCCESS;
}

/* Modules and libraries: a kernel handle is a struct with its name, as the driver's own
 * objects hold theirs (CUfunction and CUkernel are opaque pointers to driver state). The
 * same name in the same module or library is the same handle. */
#define STANDIN_MAX_KERNELS 256
struct standin_kernel {
    unsigned int magic; /* STANDIN_KERNEL or STANDIN_FUNCTION */
    char name[508];
    struct standin_kernel *kernel; /* a function made from a library kernel (cuKernelGetFunction) */
};
#define STANDIN_KERNEL 0x4b524e4c
#define STANDIN_FUNCTION 0x46554e43
struct standin_module {
    int count;
    struct standin_kernel *kernels[STANDIN_MAX_KERNELS];
};
typedef struct standin_module *CUmodule;
typedef struct standin_module *CUlibrary;
typedef struct standin_kernel *CUkernel;

static CUresult standin_load(struct standin_module **out, const void *image)
{
    (void)image;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = calloc(1, sizeof(struct standin_module));
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult standin_get(struct standin_kernel **out, struct standin_module *mod, const char *name, unsigned int magic)
{
    if (!out || !mod || !name)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < mod->count; i++) {
        if (mod->kernels[i]->magic == magic && strcmp(mod->kernels[i]->name, name) == 0) {
            *out = mod->kernels[i];
            return CUDA_SUCCESS;
        }
    }
    if (mod->count == STANDIN_MAX_KERNELS)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_kernel *k = calloc(1, sizeof(*k));
    if (!k)
        return CUDA_ERROR_INVALID_VALUE;
    k->magic = magic;
    strncpy(k->name, name, sizeof(k->name) - 1);
    mod->kernels[mod->count++] = k;
    *out = k;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) { return standin_load(module, image); }

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    return standin_get((struct standin_kernel **)hfunc, hmod, name, STANDIN_FUNCTION);
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions, void **jitOptionsValues,
                           unsigned int numJitOptions, void *libraryOptions, void **libraryOptionValues,
                           unsigned int numLibraryOptions)
{
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions; (void)libraryOptions;
    (void)libraryOptionValues; (void)numLibraryOptions;
    return standin_load(library, code);
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return standin_get(pKernel, library, name, STANDIN_KERNEL);
}

/* Not CUDA: the same loads under other names, as the runtime may reach the driver without its
 * exported symbols (cudart.c, CUDA_STANDIN_PRIVATE_DRIVER). */
CUresult standin_private_library_load(CUlibrary *library, const void *code) { return standin_load(library, code); }

CUresult standin_private_library_get_kernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return standin_get(pKernel, library, name, STANDIN_KERNEL);
}

/* A context's function for a library kernel: a handle of its own, that names the kernel. */
CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_kernel *f = calloc(1, sizeof(*f));
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    f->magic = STANDIN_FUNCTION;
    f->kernel = kernel;
    memcpy(f->name, kernel->name, sizeof(f->name));
    *pFunc = f;
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    (void)hGraphExec; (void)hStream;
    launches++;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    standin_delay("CUDA_STANDIN_ALLOC_US");
    void *p = malloc(bytesize ? bytesize : 1);
    if (!dptr || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    (void)Flags;
    standin_delay("CUDA_STANDIN_ALLOC_US");
    *pp = malloc(bytesize ? bytesize : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemFreeHost(void *p)
{
    free(p);
    return CUDA_SUCCESS;
}

static CUresult copy(void *dst, const void *src, size_t n)
{
    standin_delay("CUDA_STANDIN_COPY_US");
    if (n && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    memmove(dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    (void)hStream;
    return copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    (void)hStream;
    return copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    (void)hStream;
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, ByteCount);
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    (void)hStream;
    standin_delay("CUDA_STANDIN_SYNC_US");
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    standin_delay("CUDA_STANDIN_SYNC_US");
    return CUDA_SUCCESS;
}

/* Not probed (called many times per launch by real frameworks); here so a test can prove it is not. */
CUresult cuCtxGetDevice(int *device)
{
    *device = 0;
    return CUDA_SUCCESS;
}

/* Stream-ordered and managed allocations: malloc here too. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    (void)hStream;
    return cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    (void)hStream;
    return cuMemFree_v2(dptr);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    return cuMemAlloc_v2(dptr, bytesize);
}

/* The virtual-memory API (PyTorch's expandable segments, NCCL): a handle is physical memory
 * (here: a malloc'd block), cuMemMap gives it an address, cuMemRelease frees it. */
typedef unsigned long long CUmemGenericAllocationHandle;
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags)
{
    (void)prop; (void)flags;
    standin_delay("CUDA_STANDIN_ALLOC_US");
    void *p = malloc(size ? size : 1);
    if (!handle || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    (void)ptr; (void)size; (void)offset; (void)handle; (void)flags;
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    (void)ptr; (void)size;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    free((void *)(uintptr_t)handle);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    (void)p; (void)bytesize; (void)flags;
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p)
{
    (void)p;
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(void *event)
{
    (void)event;
    standin_delay("CUDA_STANDIN_SYNC_US");
    return CUDA_SUCCESS;
}

/* Not CUDA: loops for bench/gpu_probe_cost.py, so a probe's cost is timed without ctypes in the
 * loop. Calls go through volatile function pointers: never inlined, each reaches the probed entry. */
CUresult (*volatile standin_launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **) = cuLaunchKernel;
CUresult (*volatile standin_sync_fn)(CUstream) = cuStreamSynchronize;
CUresult (*volatile standin_alloc_fn)(CUdeviceptr *, size_t) = cuMemAlloc_v2;
CUresult (*volatile standin_free_fn)(CUdeviceptr) = cuMemFree_v2;

void standin_bench_launches(long n)
{
    for (long i = 0; i < n; i++)
        standin_launch_fn(NULL, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
}

void standin_bench_syncs(long n)
{
    for (long i = 0; i < n; i++)
        standin_sync_fn(NULL);
}

void standin_bench_allocs(long n, size_t bytes)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        standin_alloc_fn(&p, bytes);
        standin_free_fn(p);
    }
}
