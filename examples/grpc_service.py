"""Example gRPC service the demo, the tests and the bench trace (grpcio, no codegen).

Service ``demo.Inference`` with bytes messages (generic handlers, so no
protoc step):

  Predict        unary -> unary: the request reversed; a request of b"fail"
                 ends with NOT_FOUND, b"crash" with INTERNAL
  StreamTokens   unary -> stream: N tokens, N the request read as a number (default 5)
  Upload         stream -> unary: the total byte count of the requests
  Chat           stream -> stream: each request echoed back upper-cased

Server: ``python grpc_service.py serve --port 0`` prints "listening on PORT"
once ready. Client: ``python grpc_service.py call --port P [--mode ...]``
runs calls and prints one line per call ("ok <method> <status>"), so callers
can compare with the spans. ``--mode all`` runs one call of each kind plus
an error; ``concurrent`` starts ``--count`` unary calls at once on one channel;
``loop`` calls Predict back to back for ``--count`` seconds; ``sequence`` makes
``--count`` Predict calls one after the other on the channel; ``wait`` makes one
call, prints "ready", then runs Predict, StreamTokens, Upload, Predict for each
line on stdin (a channel opened and used before the agent started).
``--gate`` prints "ready" and waits for a line before opening the channel.
``--host`` (both) is the address to listen on or call (default 127.0.0.1).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent import futures

import grpc

SERVICE = "demo.Inference"


def _identity(data: bytes) -> bytes:
    return data


def predict(request: bytes, context) -> bytes:
    if request == b"fail":
        context.abort(grpc.StatusCode.NOT_FOUND, "no such item")
    if request == b"crash":
        context.abort(grpc.StatusCode.INTERNAL, "model crashed")
    return request[::-1]


def stream_tokens(request: bytes, context):
    text = request.decode(errors="replace")
    count = int(text) if text.isdigit() else 5
    for i in range(count):
        yield f"token{i}".encode()


def upload(request_iterator, context) -> bytes:
    return str(sum(len(chunk) for chunk in request_iterator)).encode()


def chat(request_iterator, context):
    for message in request_iterator:
        yield message.upper()


def handlers() -> grpc.GenericRpcHandler:
    """The service's methods as generic handlers with bytes (de)serializers."""
    ser = dict(request_deserializer=_identity, response_serializer=_identity)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Predict": grpc.unary_unary_rpc_method_handler(predict, **ser),
            "StreamTokens": grpc.unary_stream_rpc_method_handler(stream_tokens, **ser),
            "Upload": grpc.stream_unary_rpc_method_handler(upload, **ser),
            "Chat": grpc.stream_stream_rpc_method_handler(chat, **ser),
        },
    )


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve(port: int, workers: int, host: str = "127.0.0.1") -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handlers(),))
    bound = server.add_insecure_port(_address(host, port))
    server.start()
    print(f"listening on {bound}", flush=True)
    server.wait_for_termination()


class Client:
    """The four call kinds over one channel, bytes in and out."""

    def __init__(self, channel: grpc.Channel) -> None:
        ser = dict(request_serializer=_identity, response_deserializer=_identity)
        self.predict = channel.unary_unary(f"/{SERVICE}/Predict", **ser)
        self.stream_tokens = channel.unary_stream(f"/{SERVICE}/StreamTokens", **ser)
        self.upload = channel.stream_unary(f"/{SERVICE}/Upload", **ser)
        self.chat = channel.stream_stream(f"/{SERVICE}/Chat", **ser)

    def call(self, method: str, arg: bytes = b"hello") -> str:
        """One call of ``method``; its final status name (OK, NOT_FOUND...)."""
        try:
            if method == "Predict":
                self.predict(arg, timeout=10)
            elif method == "StreamTokens":
                list(self.stream_tokens(b"3", timeout=10))
            elif method == "Upload":
                self.upload(iter([b"abc", b"defg", b"hi"]), timeout=10)
            elif method == "Chat":
                list(self.chat(iter([b"one", b"two"]), timeout=10))
            else:
                raise ValueError(method)
        except grpc.RpcError as error:
            return error.code().name
        return "OK"


def run_client(port: int, mode: str, count: float, gate: bool = False, host: str = "127.0.0.1") -> None:
    if gate:  # let a tracer attach first: the channel opens after the line
        print("ready", flush=True)
        sys.stdin.readline()
    with grpc.insecure_channel(_address(host, port)) as channel:
        client = Client(channel)
        if mode == "all":
            for method in ("Predict", "StreamTokens", "Upload", "Chat"):
                print(f"ok {method} {client.call(method)}", flush=True)
            print(f"ok Predict {client.call('Predict', b'fail')}", flush=True)
        elif mode == "concurrent":
            n = int(count)
            future_calls = [client.predict.future(f"c{i}".encode(), timeout=10) for i in range(n)]
            for call in future_calls:
                call.result()
            print(f"ok concurrent {n}", flush=True)
        elif mode == "sequence":
            for i in range(int(count)):
                print(f"ok Predict {client.call('Predict', f'item{i}'.encode())}", flush=True)
        elif mode == "loop":
            deadline = time.monotonic() + count
            calls = 0
            while time.monotonic() < deadline:
                client.predict(b"hello", timeout=10)
                calls += 1
            print(f"calls {calls}", flush=True)
        elif mode == "wait":
            print(f"ok Predict {client.call('Predict')}", flush=True)
            print("ready", flush=True)
            for _line in sys.stdin:
                for method in ("Predict", "StreamTokens", "Upload", "Predict"):
                    print(f"ok {method} {client.call(method)}", flush=True)
                print("done", flush=True)
        else:
            raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve")
    serve_cmd.add_argument("--port", type=int, default=50051)
    serve_cmd.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve_cmd.add_argument("--workers", type=int, default=8)
    call_cmd = sub.add_parser("call")
    call_cmd.add_argument("--port", type=int, default=50051)
    call_cmd.add_argument("--host", default="127.0.0.1", help="the server's address (default 127.0.0.1)")
    call_cmd.add_argument("--mode", choices=("all", "concurrent", "loop", "wait", "sequence"), default="all")
    call_cmd.add_argument("--count", type=float, default=20, help="concurrent calls, or loop seconds")
    call_cmd.add_argument("--gate", action="store_true", help='print "ready", wait for a line on stdin, then start')
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.port, args.workers, args.host)
    else:
        run_client(args.port, args.mode, args.count, args.gate, args.host)


if __name__ == "__main__":
    main()
