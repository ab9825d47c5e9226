"""Example model server whose GPU host-side work has distinct Python stacks, for the GPU
profiles (docs/gpu.md "GPU profiles"): each route calls the CUDA runtime/driver through ctypes
from its own Python function, so allocation, copy, wait and launch profiles say which.

With no GPU it loads the stand-in libraries of examples/cuda_standin/build (``--lib-dir``);
``--runtime-only`` loads only libcudart.so.12 (the real one from the nvidia-cuda-runtime-cu12
wheel: without a GPU its calls fail, but they are made, probed and profiled).

Routes (query parameters in brackets; every size in bytes):
  GET /weights[?bytes=B]           load_weights: cudaMalloc, kept (model weights)
  GET /kv[?bytes=B&blocks=K]       grow_kv_cache: K cudaMalloc of B, kept (a KV cache)
  GET /scratch[?bytes=B&count=K]   scratch_buffers: K cudaMalloc of B, each freed (cudaFree)
  GET /async[?bytes=B]             stream_ordered: cudaMallocAsync of B kept, one of 2B freed (cudaFreeAsync)
  GET /managed[?bytes=B]           managed_buffer: cudaMallocManaged of B, kept
  GET /vmm[?bytes=B&keep=0|1]      expandable_segment: cuMemCreate + cuMemMap of B; without keep,
                                   cuMemUnmap + cuMemRelease
  GET /pageable[?bytes=B]          upload_pageable: cudaMemcpy H2D from pageable memory
  GET /pinned[?bytes=B]            upload_pinned: cudaHostAlloc (kept), cudaMemcpyAsync H2D from it
  GET /register[?bytes=B]          register_host: cudaHostRegister of a buffer (kept pinned)
  GET /sync                        wait_for_device: cudaDeviceSynchronize
  GET /stream_sync                 wait_for_stream: cudaStreamSynchronize
  GET /launch[?launches=N]         launch_kernels: N cudaLaunchKernel
  GET /kernels[?launches=N]        loads the stand-in CUDA library of examples/cuda_standin/kernels.cpp
                                   (its constructor registers its kernels with the runtime), then
                                   launches N of each of its kernels, each from its own function:
                                   launch_vector_add, launch_gemm, launch_layer_norm (the last the
                                   CUDA 13 way: a cudaKernel_t)
  GET /triton[?launches=N]         launch_triton_kernel: a kernel of a JIT module, as Triton runs
                                   one: cuModuleLoadData + cuModuleGetFunction (once), N cuLaunchKernelEx
  GET /jit[?launches=N]            launch_library_function: a CUDA library's kernel, its function
                                   for the context (cuLibraryGetKernel + cuKernelGetFunction, once),
                                   N cuLaunchKernel
  GET /graph[?launches=N]          replay_graph: N cuGraphLaunch
  GET /load                        loads the libraries, calls nothing
  GET /load_and_allocate[?count=K&interval_us=U&bytes=B]
                                   allocate_after_load: loads the libraries (dlopen, when not yet
                                   loaded), then K cudaMalloc of B+i bytes (i = 0..K-1), each freed,
                                   U microseconds apart; answers when the load ended and each
                                   call's offset from it (us), so a test or bench/loader_watch.py
                                   can tell which calls the agent saw
  GET /health                      204

Requests are served one at a time on the main thread (as a model engine's thread serves its
batches), or with ``--thread-per-request`` each on a thread of its own (ThreadingHTTPServer), as
many Python web servers do: every request's stacks are then taken on a thread the agent never
saw before.

Prints "listening on PORT" once ready.
"""

import argparse
import ctypes
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from cuda_api import DEFAULT_LIB_DIR, MEMCPY_HOST_TO_DEVICE, Dim3, LaunchConfig, load_driver, load_kernels, load_runtime

_VOID_P, _SIZE, _UINT, _ULL = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_ulonglong


class Gpu:
    _lock = threading.Lock()
    _loaded = None
    lib_dir = DEFAULT_LIB_DIR
    runtime_only = False

    @classmethod
    def get(cls) -> "Gpu":
        with cls._lock:
            if cls._loaded is None:
                cls._loaded = cls()
            return cls._loaded

    def __init__(self) -> None:
        rt = self.rt = load_runtime(self.lib_dir)
        for name, types in (("cudaMallocAsync", [ctypes.POINTER(_VOID_P), _SIZE, _VOID_P]),
                            ("cudaFreeAsync", [_VOID_P, _VOID_P]),
                            ("cudaMallocManaged", [ctypes.POINTER(_VOID_P), _SIZE, _UINT]),
                            ("cudaHostRegister", [_VOID_P, _SIZE, _UINT]),
                            ("cudaDeviceSynchronize", [])):  # fmt: skip
            getattr(rt, name).argtypes = types
        self.cuda = None
        if not self.runtime_only:
            cuda = self.cuda = load_driver(self.lib_dir)
            cuda.cuMemCreate.argtypes = [ctypes.POINTER(_ULL), _SIZE, _VOID_P, _ULL]
            cuda.cuMemMap.argtypes = [_ULL, _SIZE, _SIZE, _ULL, _ULL]
            cuda.cuMemUnmap.argtypes = [_ULL, _SIZE]
            cuda.cuMemRelease.argtypes = [_ULL]
        self.kept = []  # device pointers kept (weights, KV cache)
        self.host = []  # host buffers kept alive (registered, pinned)
        self.kernels = None  # the stand-in CUDA library, loaded by /kernels
        self.functions = {}  # kernel handles got from the driver, by route


def driver_function(route: str, get) -> int:
    """The kernel handle ``route`` launches, got from the driver once (``get(cuda, out)``)."""
    gpu = Gpu.get()
    if route not in gpu.functions:
        handle = ctypes.c_void_p()
        get(gpu.cuda, handle)
        gpu.functions[route] = handle.value
    return gpu.functions[route]


def _triton_function(cuda, out) -> None:
    module = ctypes.c_void_p()
    cuda.cuModuleLoadData(ctypes.byref(module), b"stand-in cubin")
    cuda.cuModuleGetFunction(ctypes.byref(out), module, b"triton_poi_fused_add_mul_0")


def _library_function(cuda, out) -> None:
    library, kernel = ctypes.c_void_p(), ctypes.c_void_p()
    cuda.cuLibraryLoadData(ctypes.byref(library), b"stand-in fatbin", None, None, 0, None, None, 0)
    cuda.cuLibraryGetKernel(ctypes.byref(kernel), library, b"_Z14flash_attn_fwdPKfS0_S0_Pfi")
    cuda.cuKernelGetFunction(ctypes.byref(out), kernel)


def kernel_library():
    gpu = Gpu.get()
    if gpu.kernels is None:
        gpu.kernels = load_kernels(gpu.lib_dir)  # dlopen: its constructor registers its kernels
    return gpu.kernels


def launch_vector_add(launches: int) -> None:
    kernel_library().standin_launch_vector_add(launches)


def launch_gemm(launches: int) -> None:
    kernel_library().standin_launch_gemm(launches)


def launch_layer_norm(launches: int) -> None:
    kernel_library().standin_launch_layer_norm(launches)


def run_kernels(launches: int) -> dict:
    launch_vector_add(launches)
    launch_gemm(launches)
    launch_layer_norm(launches)
    return {"launches": 3 * launches}


def launch_triton_kernel(launches: int) -> dict:
    function = driver_function("triton", _triton_function)
    config = LaunchConfig()
    for _ in range(launches):
        Gpu.get().cuda.cuLaunchKernelEx(ctypes.byref(config), function, None, None)
    return {"launches": launches}


def launch_library_function(launches: int) -> dict:
    function = driver_function("jit", _library_function)
    cuda = Gpu.get().cuda
    for _ in range(launches):
        cuda.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, None, None, None)
    return {"launches": launches}


def replay_graph(launches: int) -> dict:
    cuda = Gpu.get().cuda
    for _ in range(launches):
        cuda.cuGraphLaunch(ctypes.c_void_p(0xC0FFEE00), None)
    return {"launches": launches}


def preload_kernels() -> None:
    """--preload-kernels: the kernels loaded and launched once, their driver handles got, before
    the agent starts: names it can then only learn from symbols and stubs, or not at all."""
    run_kernels(1)
    launch_triton_kernel(1)


def _malloc(size: int) -> int:
    device = ctypes.c_void_p()
    rc = Gpu.get().rt.cudaMalloc(ctypes.byref(device), size)
    return device.value or 0 if rc == 0 else 0


def load_weights(size: int) -> dict:
    pointer = _malloc(size)
    Gpu.get().kept.append(pointer)
    return {"weights": size, "ok": bool(pointer)}


def grow_kv_cache(size: int, blocks: int) -> dict:
    made = 0
    for _ in range(blocks):
        pointer = _malloc(size)
        Gpu.get().kept.append(pointer)
        made += bool(pointer)
    return {"blocks": made}


def scratch_buffers(size: int, count: int) -> dict:
    rt = Gpu.get().rt
    for _ in range(count):
        pointer = _malloc(size)
        rt.cudaFree(ctypes.c_void_p(pointer))
    return {"scratch": count}


def stream_ordered(size: int) -> dict:
    rt = Gpu.get().rt
    kept, freed = ctypes.c_void_p(), ctypes.c_void_p()
    rc = rt.cudaMallocAsync(ctypes.byref(kept), size, None)
    rt.cudaMallocAsync(ctypes.byref(freed), 2 * size, None)
    rt.cudaFreeAsync(freed, None)
    Gpu.get().kept.append(kept.value)
    return {"rc": rc}


def managed_buffer(size: int) -> dict:
    pointer = ctypes.c_void_p()
    rc = Gpu.get().rt.cudaMallocManaged(ctypes.byref(pointer), size, 1)
    Gpu.get().kept.append(pointer.value)
    return {"rc": rc}


def expandable_segment(size: int, keep: bool) -> dict:
    cuda = Gpu.get().cuda
    handle = ctypes.c_ulonglong()
    rc = cuda.cuMemCreate(ctypes.byref(handle), size, None, 0)
    address = 0x7F0000000000 + (handle.value & 0xFFFFFFF000)  # a reserved range, as cuMemAddressReserve gives
    cuda.cuMemMap(address, size, 0, handle.value, 0)
    if not keep:
        cuda.cuMemUnmap(address, size)
        cuda.cuMemRelease(handle.value)
    return {"rc": rc, "handle": handle.value}


def upload_pageable(size: int) -> dict:
    gpu = Gpu.get()
    device = _malloc(size)
    gpu.kept.append(device)
    host = ctypes.create_string_buffer(size)  # pageable
    rc = gpu.rt.cudaMemcpy(ctypes.c_void_p(device), host, size, MEMCPY_HOST_TO_DEVICE)
    return {"rc": rc}


def upload_pinned(size: int) -> dict:
    gpu = Gpu.get()
    host = ctypes.c_void_p()
    gpu.rt.cudaHostAlloc(ctypes.byref(host), size, 0)
    device = _malloc(size)
    gpu.kept.append(device)
    rc = gpu.rt.cudaMemcpyAsync(ctypes.c_void_p(device), host, size, MEMCPY_HOST_TO_DEVICE, None)
    return {"rc": rc}


def register_host(size: int) -> dict:
    gpu = Gpu.get()
    buffer = ctypes.create_string_buffer(size)
    gpu.host.append(buffer)
    rc = gpu.rt.cudaHostRegister(buffer, size, 0)
    return {"rc": rc}


def wait_for_device() -> dict:
    return {"rc": Gpu.get().rt.cudaDeviceSynchronize()}


def wait_for_stream() -> dict:
    return {"rc": Gpu.get().rt.cudaStreamSynchronize(None)}


def launch_kernels(launches: int) -> dict:
    rt = Gpu.get().rt
    kernel = ctypes.c_void_p(0x1000)
    for _ in range(launches):
        rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(128, 1, 1), None, 0, None)
    return {"launches": launches}


def allocate_after_load(count: int, interval_us: int, size: int) -> dict:
    rt = Gpu.get().rt  # the first call dlopen()s the libraries
    loaded = time.monotonic_ns()
    offsets = []
    for i in range(count):
        offsets.append((time.monotonic_ns() - loaded) // 1000)
        rt.cudaFree(ctypes.c_void_p(_malloc(size + i)))
        time.sleep(interval_us / 1e6)
    return {"loaded_ns": loaded, "offsets_us": offsets}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, status: int, payload=None) -> None:
        body = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlsplit(self.path)
        q = {k: int(v[-1]) for k, v in parse_qs(url.query).items() if v and v[-1].isdigit()}
        if url.path == "/health":
            self.send_response(204)
            self.end_headers()
            return
        size = q.get("bytes", 4096)
        routes = {
            "/load": lambda: {"loaded": bool(Gpu.get())},
            "/weights": lambda: load_weights(size),
            "/kv": lambda: grow_kv_cache(size, q.get("blocks", 1)),
            "/scratch": lambda: scratch_buffers(size, q.get("count", 1)),
            "/async": lambda: stream_ordered(size),
            "/managed": lambda: managed_buffer(size),
            "/vmm": lambda: expandable_segment(size, bool(q.get("keep", 0))),
            "/pageable": lambda: upload_pageable(size),
            "/pinned": lambda: upload_pinned(size),
            "/register": lambda: register_host(size),
            "/sync": wait_for_device,
            "/stream_sync": wait_for_stream,
            "/launch": lambda: launch_kernels(q.get("launches", 1)),
            "/load_and_allocate": lambda: allocate_after_load(q.get("count", 100), q.get("interval_us", 1000), size),
            "/kernels": lambda: run_kernels(q.get("launches", 1)),
            "/triton": lambda: launch_triton_kernel(q.get("launches", 1)),
            "/jit": lambda: launch_library_function(q.get("launches", 1)),
            "/graph": lambda: replay_graph(q.get("launches", 1)),
        }
        route = routes.get(url.path)
        if route is None:
            self._send(404, {"error": "not found"})
            return
        try:
            self._send(200, route())
        except (OSError, RuntimeError, AttributeError) as exc:
            self._send(500, {"error": str(exc)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lib-dir", default=DEFAULT_LIB_DIR)
    parser.add_argument("--runtime-only", action="store_true", help="load only libcudart.so.12 (e.g. the real one)")
    parser.add_argument("--thread-per-request", action="store_true", help="serve each request on a new thread")
    parser.add_argument("--preload-kernels", action="store_true",
                        help="load and launch the kernels once at start (before an agent attaches)")
    args = parser.parse_args()
    Gpu.lib_dir, Gpu.runtime_only = args.lib_dir, args.runtime_only
    if args.preload_kernels:
        preload_kernels()
    # one serving thread, like an engine's; or a thread per request, like ThreadingHTTPServer's users
    server = (ThreadingHTTPServer if args.thread_per_request else HTTPServer)((args.host, args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
