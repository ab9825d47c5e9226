/* Stand-in for the CUDA runtime (libcudart.so.12): the real names and signatures
 * (cuda_runtime_api.h), versioned like the real ones (cudart.map), each
 * implemented by calling the stand-in driver as the real runtime does
 * (cudaMemcpy -> cuMemcpyHtoD_v2, cudaLaunchKernel -> cuLaunchKernel...), so
 * that "a runtime call and the driver call it makes are one operation" can be
 * tested. */
#include <stddef.h>
#include <stdint.h>
#include "standin.h"

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaGraphExec_t;
typedef struct { unsigned int x, y, z; } dim3;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };

/* the stand-in driver's entry points (libcuda.so.1) */
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
int cuMemFree_v2(CUdeviceptr dptr);
int cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
int cuMemFreeHost(void *p);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream);
int cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream);
int cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream);
int cuStreamSynchronize(void *stream);
int cuCtxSynchronize(void);
int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int shared, void *stream, void **params, void **extra);
int cuGraphLaunch(void *exec, void *stream);
int cuCtxGetDevice(int *device);
int cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, void *stream);
int cuMemFreeAsync(CUdeviceptr dptr, void *stream);
int cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
int cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
int cuMemHostUnregister(void *p);
int cuEventSynchronize(void *event);

cudaError_t cudaGetDevice(int *device) { return cuCtxGetDevice(device); }

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, size);
    *devPtr = (void *)(uintptr_t)p;
    return rc;
}

cudaError_t cudaFree(void *devPtr) { return cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) { return cuMemHostAlloc(pHost, size, flags); }
cudaError_t cudaMallocHost(void **ptr, size_t size) { return cuMemHostAlloc(ptr, size, 0); }
cudaError_t cudaFreeHost(void *ptr) { return cuMemFreeHost(ptr); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    switch (kind) {
    case cudaMemcpyHostToDevice:
        return cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)dst, src, count);
    case cudaMemcpyDeviceToHost:
        return cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, count);
    default:
        return cuMemcpyDtoD_v2((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count);
    }
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    switch (kind) {
    case cudaMemcpyHostToDevice:
        return cuMemcpyHtoDAsync_v2((CUdeviceptr)(uintptr_t)dst, src, count, stream);
    case cudaMemcpyDeviceToHost:
        return cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)(uintptr_t)src, count, stream);
    default:
        return cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count, stream);
    }
}

cudaError_t cudaDeviceSynchronize(void) { return cuCtxSynchronize(); }
cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return cuStreamSynchronize(stream); }

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream)
{
    return cuLaunchKernel((void *)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z,
                          (unsigned int)sharedMem, stream, args, NULL);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) { return cuGraphLaunch(graphExec, stream); }

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    CUdeviceptr p = 0;
    int rc = cuMemAllocAsync(&p, size, stream);
    *devPtr = (void *)(uintptr_t)p;
    return rc;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) { return cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, stream); }

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    CUdeviceptr p = 0;
    int rc = cuMemAllocManaged(&p, size, flags);
    *devPtr = (void *)(uintptr_t)p;
    return rc;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) { return cuMemHostRegister_v2(ptr, size, flags); }
cudaError_t cudaHostUnregister(void *ptr) { return cuMemHostUnregister(ptr); }
cudaError_t cudaEventSynchronize(void *event) { return cuEventSynchronize(event); }
