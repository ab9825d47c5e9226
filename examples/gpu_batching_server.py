"""Example continuous-batching inference server: FastAPI handlers hand their
requests to a batching engine that runs the GPU (the stand-in CUDA libraries
of examples/cuda_standin, through ctypes) once for the whole batch, the way
vLLM's engine core serves every request in flight at once. Unmodified
tracing target: otelbpf shows each engine step as a ``gpu step`` span linked
to the requests it served (docs/gpu.md, "Batching engines").

The engine is a worker thread of this process (``--engine thread``) or a
separate process started by this one and fed over a pipe (``--engine
process``, like vLLM's engine core). A batch is what is queued when the engine
picks it up, waiting at most ``--batch-wait-ms`` for ``--batch-size`` requests.
One step per batch: a pageable host-to-device cudaMemcpy of the inputs,
``launches`` cuLaunchKernel per request, a device-to-host cudaMemcpyAsync and
a cudaStreamSynchronize, where the engine waits for its batch. With ``--cpu-burst-ms``, the step
also spends that long on the CPU (in ``burn_cpu``, between the input copy and the launches), as
an engine that prepares its batch on the host does: enough to be profiled.

Routes:
  GET /generate/ID[?launches=N]     queued for the engine; answers {"id", "batch": [ids], "step"}
  GET /async_infer/N                an ``async def`` handler calling CUDA itself on the event loop,
                                    yielding between calls so concurrent requests interleave:
                                    cudaMalloc, N cudaLaunchKernel, D2H cudaMemcpy, cudaFree
  GET /engine                       {"pid": the engine's process id}
  GET /load                         loads the libraries in this process, calls nothing

Prints "listening on PORT" once ready.
"""

import argparse
import asyncio
import ctypes
import multiprocessing
import os
import queue
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from cuda_api import DEFAULT_LIB_DIR, MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, Dim3, check, load_driver, load_runtime
BYTES_PER_REQUEST = 256


class Cuda:
    """The runtime and the driver, loaded once per process."""

    def __init__(self, lib_dir: str, burst_s: float = 0.0) -> None:
        self.rt = load_runtime(lib_dir)
        self.drv = load_driver(lib_dir)
        self.device = ctypes.c_void_p()
        self.burst_s = burst_s

    def reserve(self) -> "Cuda":
        """The engine's device buffer, allocated once at start-up (as an engine reserves its cache)."""
        check(self.rt.cudaMalloc(ctypes.byref(self.device), 1 << 20), "cudaMalloc")
        return self

    def step(self, launches: list[int]) -> None:
        """One engine step for a batch: inputs in, kernels, outputs out, wait."""
        size = BYTES_PER_REQUEST * len(launches)
        host = ctypes.create_string_buffer(size)
        check(self.rt.cudaMemcpy(self.device, host, size, MEMCPY_HOST_TO_DEVICE), "cudaMemcpy")
        if self.burst_s:
            burn_cpu(self.burst_s)
        for _ in range(sum(launches)):
            check(self.drv.cuLaunchKernel(ctypes.c_void_p(0x4000), 1, 1, 1, 128, 1, 1, 0, None, None, None), "cuLaunchKernel")
        check(self.rt.cudaMemcpyAsync(host, self.device, size, MEMCPY_DEVICE_TO_HOST, None), "cudaMemcpyAsync")
        check(self.rt.cudaStreamSynchronize(None), "cudaStreamSynchronize")


def burn_cpu(seconds: float) -> int:
    """Host work of a step: ``seconds`` on the CPU."""
    end = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < end:
        spins += sum(range(200))
    return spins


def collect(take, first, size: int, wait_s: float) -> list:
    """The batch: ``first`` and whatever else is queued, up to ``size``, waiting at most ``wait_s``."""
    batch = [first]
    end = time.monotonic() + wait_s
    while len(batch) < size:
        remaining = end - time.monotonic()
        if remaining <= 0:
            break
        try:
            batch.append(take(remaining))
        except queue.Empty:
            break
    return batch


def engine_process(conn, lib_dir: str, burst_s: float = 0.0) -> None:
    """The engine in its own process: a batch of launch counts in, one step, the step number out."""
    cuda = Cuda(lib_dir, burst_s).reserve()
    conn.send(os.getpid())
    step = 0
    while True:
        launches = conn.recv()
        if launches is None:
            return
        cuda.step(launches)
        step += 1
        conn.send(step)


class Engine:
    """Batches queued requests and runs one GPU step per batch (in a thread, or in a child process)."""

    def __init__(self, mode: str, lib_dir: str, batch_size: int, batch_wait_s: float, burst_s: float = 0.0) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.batch_size, self.batch_wait_s = batch_size, batch_wait_s
        self.steps = 0
        if mode == "process":
            context = multiprocessing.get_context("spawn")
            self.conn, child = context.Pipe()
            self.process = context.Process(target=engine_process, args=(child, lib_dir, burst_s), daemon=True)
            self.process.start()
            self.pid = self.conn.recv()
            self.run_step = self._remote_step
        else:
            self.cuda = Cuda(lib_dir, burst_s).reserve()
            self.pid = os.getpid()
            self.run_step = self._local_step
        threading.Thread(target=self._loop, name="batching-engine", daemon=True).start()

    def _local_step(self, launches: list[int]) -> int:
        self.cuda.step(launches)
        self.steps += 1
        return self.steps

    def _remote_step(self, launches: list[int]) -> int:
        self.conn.send(launches)
        return self.conn.recv()

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            batch = collect(lambda timeout: self.queue.get(timeout=timeout), first, self.batch_size, self.batch_wait_s)
            try:
                step = self.run_step([launches for _id, launches, _done in batch])
                answer = {"batch": sorted(item_id for item_id, _l, _d in batch), "step": step}
            except (OSError, RuntimeError) as exc:
                answer = {"error": str(exc)}
            for item_id, _launches, done in batch:
                done({"id": item_id, **answer})

    def submit(self, item_id: str, launches: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put((item_id, launches, lambda answer: loop.call_soon_threadsafe(future.set_result, answer)))
        return future


app = FastAPI()
state: dict = {}


@app.get("/generate/{item_id}")
async def generate(item_id: str, launches: int = 2) -> dict:
    return await state["engine"].submit(item_id, launches)


@app.get("/async_infer/{launches}")
async def async_infer(launches: int) -> dict:
    """CUDA from the handler's own task, on the event loop; the awaits let other requests' calls interleave."""
    cuda = loaded()
    rt = cuda.rt
    device = ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(device), 4096), "cudaMalloc")
    await asyncio.sleep(0.005)
    kernel = ctypes.c_void_p(0x1000)
    for _ in range(launches):
        check(rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(128, 1, 1), None, 0, None), "cudaLaunchKernel")
        await asyncio.sleep(0.001)
    host = ctypes.create_string_buffer(4096)
    check(rt.cudaMemcpy(host, device, 4096, MEMCPY_DEVICE_TO_HOST), "cudaMemcpy")
    await asyncio.sleep(0.002)
    check(rt.cudaFree(device), "cudaFree")
    return {"launches": launches, "device_ptr": device.value}


@app.get("/engine")
async def engine() -> dict:
    return {"pid": state["engine"].pid}


@app.get("/load")
async def load() -> dict:
    loaded()
    return {"loaded": True}


def loaded() -> Cuda:
    if "cuda" not in state:
        state["cuda"] = Cuda(state["lib_dir"])
    return state["cuda"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lib-dir", default=DEFAULT_LIB_DIR, help="where libcudart.so.12 and libcuda.so.1 are")
    parser.add_argument("--engine", choices=("thread", "process"), default="thread")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-ms", type=float, default=20.0)
    parser.add_argument("--cpu-burst-ms", type=float, default=0.0, help="CPU time per engine step (burn_cpu), 0: none")
    args = parser.parse_args()
    state["lib_dir"] = args.lib_dir
    state["engine"] = Engine(args.engine, args.lib_dir, args.batch_size, args.batch_wait_ms / 1000,
                             args.cpu_burst_ms / 1000)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(256)  # ready for clients from the moment "listening" is printed
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, backlog=256))
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
