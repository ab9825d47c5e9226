"""Example inference server calling the CUDA runtime/driver and NCCL through
ctypes from its request handler, the way a model server does (unmodified,
stdlib only). With no GPU it loads the stand-in libraries of
examples/cuda_standin/build (``--lib-dir``); the tracer sees the same calls
it would see against the real ones.

The libraries are loaded on the first request, not at start-up (like a
process that imports torch late), so a tracer started before that request
must find them in the process's maps later.

Routes (query parameters in brackets):
  GET /infer[?launches=N&bytes=B]   cudaMalloc, pageable H2D cudaMemcpy, N cudaLaunchKernel,
                                    cudaDeviceSynchronize, D2H cudaMemcpy, cudaFree
  GET /pinned[?bytes=B]             cudaHostAlloc, cudaMemcpyAsync from pinned memory,
                                    cudaStreamSynchronize, cudaFreeHost
  GET /driver[?launches=N]          N cuLaunchKernelEx + cuGraphLaunch, cuStreamSynchronize (driver API)
  GET /launch[?launches=N]          N cuLaunchKernelEx and no other call (no timeline call follows them)
  GET /small[?calls=N]              N tiny cudaMalloc + cudaFree pairs, then a cudaDeviceSynchronize
  GET /allreduce[?count=C&rank=R&nranks=K]
                                    ncclCommInitRank (rank R of K), ncclAllReduce of C float32, ncclCommDestroy
  GET /keep[?bytes=B]               cudaMalloc, kept (a cache growing)
  GET /release                      cudaFree of the oldest kept allocation
  GET /load                         loads the libraries, calls nothing
  GET /health                       204, touches no library

Prints "listening on PORT" once ready.
"""

import argparse
import ctypes
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from cuda_api import (
    DEFAULT_LIB_DIR, MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, NCCL_FLOAT32, NCCL_SUM, Dim3, LaunchConfig, UniqueId,
    check, load_driver, load_nccl, load_runtime,
)  # fmt: skip



class Gpu:
    """The three libraries, loaded once on first use."""

    _lock = threading.Lock()
    _loaded = None

    @classmethod
    def get(cls, lib_dir: str) -> "Gpu":
        with cls._lock:
            if cls._loaded is None:
                cls._loaded = cls(lib_dir)
            return cls._loaded

    def __init__(self, lib_dir: str) -> None:
        self.cudart = load_runtime(lib_dir)
        self.cuda = load_driver(lib_dir)
        self.nccl = load_nccl(lib_dir)
        self.kept: list[int] = []  # device allocations kept across requests (/keep, /release)

    def infer(self, launches: int, size: int) -> dict:
        rt = self.cudart
        device = ctypes.c_void_p()
        check(rt.cudaMalloc(ctypes.byref(device), size), "cudaMalloc")
        host = ctypes.create_string_buffer(b"x" * size, size)  # pageable (not pinned) host memory
        check(rt.cudaMemcpy(device, host, size, MEMCPY_HOST_TO_DEVICE), "cudaMemcpy")
        kernel = ctypes.c_void_p(0x1000)
        for _ in range(launches):
            check(rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(128, 1, 1), None, 0, None), "cudaLaunchKernel")
        check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        check(rt.cudaMemcpy(host, device, size, MEMCPY_DEVICE_TO_HOST), "cudaMemcpy")
        check(rt.cudaFree(device), "cudaFree")
        return {"launches": launches, "bytes": size, "device_ptr": device.value}

    def keep(self, size: int) -> dict:
        device = ctypes.c_void_p()
        check(self.cudart.cudaMalloc(ctypes.byref(device), size), "cudaMalloc")
        self.kept.append(device.value)
        return {"device_ptr": device.value, "kept": len(self.kept)}

    def release(self) -> dict:
        if not self.kept:
            return {"kept": 0}
        check(self.cudart.cudaFree(ctypes.c_void_p(self.kept.pop(0))), "cudaFree")
        return {"kept": len(self.kept)}

    def pinned(self, size: int) -> dict:
        rt = self.cudart
        host, device = ctypes.c_void_p(), ctypes.c_void_p()
        check(rt.cudaHostAlloc(ctypes.byref(host), size, 0), "cudaHostAlloc")
        check(rt.cudaMalloc(ctypes.byref(device), size), "cudaMalloc")
        check(rt.cudaMemcpyAsync(device, host, size, MEMCPY_HOST_TO_DEVICE, None), "cudaMemcpyAsync")
        check(rt.cudaStreamSynchronize(None), "cudaStreamSynchronize")
        check(rt.cudaFree(device), "cudaFree")
        check(rt.cudaFreeHost(host), "cudaFreeHost")
        return {"bytes": size, "host_ptr": host.value}

    def driver(self, launches: int) -> dict:
        config = LaunchConfig()
        for _ in range(launches):
            check(self.cuda.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(0x2000), None, None), "cuLaunchKernelEx")
        check(self.cuda.cuGraphLaunch(ctypes.c_void_p(0x3000), None), "cuGraphLaunch")
        check(self.cuda.cuStreamSynchronize(None), "cuStreamSynchronize")
        return {"launches": launches + 1}

    def launch_only(self, launches: int) -> dict:
        config = LaunchConfig()
        for _ in range(launches):
            check(self.cuda.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(0x2000), None, None), "cuLaunchKernelEx")
        return {"launches": launches}

    def small_calls(self, calls: int) -> dict:
        rt = self.cudart
        for _ in range(calls):
            device = ctypes.c_void_p()
            check(rt.cudaMalloc(ctypes.byref(device), 64), "cudaMalloc")
            check(rt.cudaFree(device), "cudaFree")
        check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        return {"calls": calls}

    def allreduce(self, count: int, rank: int, nranks: int) -> dict:
        comm = ctypes.c_void_p()
        unique = UniqueId()
        ctypes.memmove(ctypes.addressof(unique), bytes(range(128)), 128)  # (c_char arrays stop at a NUL)
        check(self.nccl.ncclCommInitRank(ctypes.byref(comm), nranks, unique, rank), "ncclCommInitRank")
        buffer = ctypes.create_string_buffer(count * 4)
        check(self.nccl.ncclAllReduce(buffer, buffer, count, NCCL_FLOAT32, NCCL_SUM, comm, None), "ncclAllReduce")
        check(self.nccl.ncclCommDestroy(comm), "ncclCommDestroy")
        return {"count": count, "rank": rank, "nranks": nranks, "comm": comm.value}


class InferenceHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    lib_dir = DEFAULT_LIB_DIR

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
        query = {k: int(v[-1]) for k, v in parse_qs(url.query).items() if v and v[-1].lstrip("-").isdigit()}
        if url.path == "/health":
            self.send_response(204)
            self.end_headers()
            return
        routes = {
            "/infer": lambda gpu: gpu.infer(query.get("launches", 8), query.get("bytes", 4096)),
            "/pinned": lambda gpu: gpu.pinned(query.get("bytes", 4096)),
            "/load": lambda gpu: {"loaded": True},
            "/keep": lambda gpu: gpu.keep(query.get("bytes", 4096)),
            "/release": lambda gpu: gpu.release(),
            "/driver": lambda gpu: gpu.driver(query.get("launches", 4)),
            "/launch": lambda gpu: gpu.launch_only(query.get("launches", 4)),
            "/small": lambda gpu: gpu.small_calls(query.get("calls", 3)),
            "/allreduce": lambda gpu: gpu.allreduce(query.get("count", 1024), query.get("rank", 0), query.get("nranks", 1)),
        }
        route = routes.get(url.path)
        if route is None:
            self._send(404, {"error": "not found"})
            return
        try:
            self._send(200, route(Gpu.get(self.lib_dir)))
        except (OSError, RuntimeError) as exc:
            self._send(500, {"error": str(exc)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lib-dir", default=DEFAULT_LIB_DIR, help="where libcudart.so.12, libcuda.so.1, libnccl.so.2 are")
    args = parser.parse_args()
    InferenceHandler.lib_dir = args.lib_dir
    server = ThreadingHTTPServer((args.host, args.port), InferenceHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
