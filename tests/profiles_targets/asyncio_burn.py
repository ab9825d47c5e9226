"""An asyncio HTTP/1.1 responder (asyncio.start_server, one event-loop thread)
serving two kinds of request at once: GET /a?round=K burns CPU in burn_a,
GET /b?round=K in burn_b, in bursts with awaits between them.

The two requests of a round wait for each other before burning, so both are
in flight together on the one thread and their bursts interleave: a sample in
burn_a belongs to the /a request of its round, never to the /b one.
Prints "listening on PORT" once ready.
"""

import asyncio
import time
from collections import defaultdict

BURSTS = 12
BURST_CPU_S = 0.006
arrived = defaultdict(int)
both_here = defaultdict(asyncio.Event)


def _spin(cpu_s):
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        for _ in range(2000):
            pass


def burn_a():
    _spin(BURST_CPU_S)


def burn_b():
    _spin(BURST_CPU_S)


async def handle(reader, writer):
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        path = head.split(b" ", 2)[1].decode()
        route, _, query = path.partition("?")
        round_id = query.partition("=")[2]
        arrived[round_id] += 1
        if arrived[round_id] == 2:
            both_here[round_id].set()
        await asyncio.wait_for(both_here[round_id].wait(), 10)
        burn = burn_a if route == "/a" else burn_b
        for _ in range(BURSTS):
            burn()
            await asyncio.sleep(0)
        body = f"{route} {round_id}\n".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
