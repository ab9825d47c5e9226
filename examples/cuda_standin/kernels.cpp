/* Stand-in for a CUDA library's host side, as nvcc compiles a .cu file (no device code here:
 * the fat binary is a placeholder). What the agent learns kernel names from:
 *
 *  - the constructor nvcc emits registers the fat binary, then each kernel's host function
 *    with the kernel's device name (__cudaRegisterFunction): seen when libcudart is probed
 *    before this library loads;
 *  - each kernel's host function carries the kernel's own (mangled) name, and calls its
 *    __device_stub__ function, which calls cudaLaunchKernel with the host function's address:
 *    the symbol of that address, or the stub's frame on the launch stack, names the kernel
 *    where the registration was not seen;
 *  - the runtime loads the fat binary and gets each kernel by name on its first launch
 *    (examples/cuda_standin/cudart.c: cuLibraryGetKernel), then launches it with cuLaunchKernel;
 *  - layer_norm's stub does what CUDA 13's do: it turns its host function into a cudaKernel_t
 *    once (__cudaGetKernel) and launches that.
 *
 * standin_launch_* are what a C++ caller's `kernel<<<grid, block>>>(args)` compiles to, exported
 * for examples/gpu_profile_server.py (ctypes). */
#include <stddef.h>

extern "C" {
typedef struct { unsigned int x, y, z; } dim3;
typedef struct { unsigned int x, y, z; } uint3;
typedef int cudaError_t;
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, void *stream);
cudaError_t __cudaGetKernel(void **kernel, const void *hostFun);
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
}

static char fatbin[] = "stand-in fat binary";
static const dim3 GRID = {64, 1, 1}, BLOCK = {256, 1, 1};

/* __global__ void vector_add(const float *a, const float *b, float *c, int n) */
void vector_add(const float *a, const float *b, float *c, int n);
__attribute__((noinline)) void __device_stub__Z10vector_addPKfS0_Pfi(const float *a, const float *b, float *c, int n)
{
    void *args[] = {&a, &b, &c, &n};
    cudaLaunchKernel((const void *)vector_add, GRID, BLOCK, args, 0, 0);
}
__attribute__((noinline)) void vector_add(const float *a, const float *b, float *c, int n)
{
    __device_stub__Z10vector_addPKfS0_Pfi(a, b, c, n);
}

/* template <typename T, int TILE> __global__ void gemm_kernel(const T *a, const T *b, T *c, int n) */
void __device_stub__Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i(const float *a, const float *b, float *c, int n);
template <typename T, int TILE> __attribute__((noinline)) void gemm_kernel(const T *a, const T *b, T *c, int n)
{
    __device_stub__Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i(a, b, c, n);
}
template void gemm_kernel<float, 128>(const float *a, const float *b, float *c, int n);
__attribute__((noinline)) void __device_stub__Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i(const float *a, const float *b, float *c, int n)
{
    void *args[] = {&a, &b, &c, &n};
    cudaLaunchKernel((const void *)gemm_kernel<float, 128>, GRID, BLOCK, args, 0, 0);
}

/* __global__ void layer_norm(float *x, int n), launched the CUDA 13 way */
void layer_norm(float *x, int n);
__attribute__((noinline)) void __device_stub__Z10layer_normPfi(float *x, int n)
{
    static void *kernel;
    if (!kernel)
        __cudaGetKernel(&kernel, (const void *)layer_norm);
    void *args[] = {&x, &n};
    cudaLaunchKernel(kernel, GRID, BLOCK, args, 0, 0);
}
__attribute__((noinline)) void layer_norm(float *x, int n)
{
    __device_stub__Z10layer_normPfi(x, n);
}

/* nvcc's registration constructor */
__attribute__((constructor)) static void register_kernels(void)
{
    void **handle = __cudaRegisterFatBinary(fatbin);
    __cudaRegisterFunction(handle, (const char *)vector_add, (char *)"_Z10vector_addPKfS0_Pfi",
                           "_Z10vector_addPKfS0_Pfi", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFunction(handle, (const char *)gemm_kernel<float, 128>, (char *)"_Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i",
                           "_Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFunction(handle, (const char *)layer_norm, (char *)"_Z10layer_normPfi", "_Z10layer_normPfi", -1, 0, 0, 0, 0, 0);
    __cudaRegisterFatBinaryEnd(handle);
}

static float data[1024];

extern "C" {
void standin_launch_vector_add(int launches)
{
    for (int i = 0; i < launches; i++)
        vector_add(data, data, data, 1024);
}

void standin_launch_gemm(int launches)
{
    for (int i = 0; i < launches; i++)
        gemm_kernel<float, 128>(data, data, data, 32);
}

void standin_launch_layer_norm(int launches)
{
    for (int i = 0; i < launches; i++)
        layer_norm(data, 1024);
}
}
