/* Stand-in for the CUDA runtime (libcudart.so.12): the real names and signatures
 * (cuda_runtime_api.h), versioned like the real ones (cudart.map), each
 * implemented by calling the stand-in driver as the real runtime does
 * (cudaMemcpy -> cuMemcpyHtoD_v2, cudaLaunchKernel -> cuLaunchKernel...), so
 * that "a runtime call and the driver call it makes are one operation" can be
 * tested. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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

/* Kernel registration, as nvcc's host code does it (crt/host_runtime.h): a library's
 * constructor registers its fat binary, then each kernel's host function (the address its
 * launches pass) with the kernel's device name. The runtime loads the fat binary as a CUDA
 * library on a kernel's first launch and gets the kernel by that name (CUDA 12's lazy loading:
 * cuLibraryLoadData, cuLibraryGetKernel), then launches the CUkernel through cuLaunchKernel. */
typedef struct { unsigned int x, y, z; } uint3;
typedef void *CUlibrary;
typedef void *CUkernel;
int cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions, void **jitOptionsValues,
                      unsigned int numJitOptions, void *libraryOptions, void **libraryOptionValues,
                      unsigned int numLibraryOptions);
int cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);

#define STANDIN_MAX_REGISTERED 256
struct registered {
    const void *host;      /* the host function (the stub's target), what launches pass */
    const char *name;      /* the device function's (mangled) name */
    void **fatbin;         /* __cudaRegisterFatBinary's handle */
    CUkernel kernel;       /* once loaded */
    int runtime_handle;    /* a cudaKernel_t handed out for it (__cudaGetKernel): its index + 1 */
};
static struct registered registry[STANDIN_MAX_REGISTERED];
static int registered_count;
static CUlibrary fatbin_libraries[STANDIN_MAX_REGISTERED];
static void *fatbin_images[STANDIN_MAX_REGISTERED];
static int fatbin_count;

void **__cudaRegisterFatBinary(void *fatCubin)
{
    if (fatbin_count == STANDIN_MAX_REGISTERED)
        return 0;
    fatbin_images[fatbin_count] = fatCubin;
    return &fatbin_images[fatbin_count++];
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

void __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)deviceName; (void)thread_limit; (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;
    if (registered_count == STANDIN_MAX_REGISTERED)
        return;
    registry[registered_count].host = hostFun;
    registry[registered_count].name = deviceFun;
    registry[registered_count].fatbin = fatCubinHandle;
    registered_count++;
}

/* The registered kernel a launch names: by its host function, or by the cudaKernel_t
 * __cudaGetKernel handed out for it (CUDA 13's stubs pass that). */
static struct registered *registered_kernel(const void *func)
{
    for (int i = 0; i < registered_count; i++)
        if (registry[i].host == func || (registry[i].runtime_handle && (const void *)&registry[i] == func))
            return &registry[i];
    return 0;
}

/* CUDA 13: the host stub turns its host function into an opaque cudaKernel_t once. */
cudaError_t __cudaGetKernel(void **kernel, const void *hostFun)
{
    struct registered *r = registered_kernel(hostFun);
    if (!kernel || !r)
        return 1; /* cudaErrorInvalidValue */
    r->runtime_handle = 1;
    *kernel = r;
    return 0;
}

/* A stand-in for the driver entry points a runtime may reach without the exported symbols
 * (the real one gets them through cuGetProcAddress): with CUDA_STANDIN_PRIVATE_DRIVER=1 the
 * library loads use these, so the driver's probes never see the kernels' names. */
int standin_private_library_load(CUlibrary *library, const void *code);
int standin_private_library_get_kernel(CUkernel *kernel, CUlibrary library, const char *name);

/* The driver handle to launch for `func`: its library kernel (loaded on first use), or
 * `func` itself where nothing was registered for it (a caller passing a driver handle). */
static void *driver_kernel(const void *func)
{
    struct registered *r = registered_kernel(func);
    if (!r)
        return (void *)func;
    if (!r->kernel) {
        int slot = (int)(r->fatbin - fatbin_images);
        const char *private_driver = getenv("CUDA_STANDIN_PRIVATE_DRIVER");
        if (private_driver && atoi(private_driver)) {
            if (!fatbin_libraries[slot])
                standin_private_library_load(&fatbin_libraries[slot], *r->fatbin);
            standin_private_library_get_kernel(&r->kernel, fatbin_libraries[slot], r->name);
        } else {
            if (!fatbin_libraries[slot])
                cuLibraryLoadData(&fatbin_libraries[slot], *r->fatbin, 0, 0, 0, 0, 0, 0);
            cuLibraryGetKernel(&r->kernel, fatbin_libraries[slot], r->name);
        }
    }
    return r->kernel;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream)
{
    return cuLaunchKernel(driver_kernel(func), gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z,
                          (unsigned int)sharedMem, stream, args, NULL);
}

/* cudaLaunchKernelEx's function: the kernel is its second argument. */
typedef struct { dim3 gridDim; dim3 blockDim; size_t dynamicSmemBytes; cudaStream_t stream; void *attrs; unsigned int numAttrs; } cudaLaunchConfig_t;
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    return cuLaunchKernel(driver_kernel(func), config->gridDim.x, config->gridDim.y, config->gridDim.z,
                          config->blockDim.x, config->blockDim.y, config->blockDim.z,
                          (unsigned int)config->dynamicSmemBytes, config->stream, args, NULL);
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
