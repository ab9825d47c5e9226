"""A deterministic v2 inference protocol server over gRPC (Triton / KServe's
``inference.GRPCInferenceService``), for the demo and the tests: grpcio and the protobuf
stubs that ship with ``tritonclient[grpc]``.

The identity model of examples/triton_mock_server.py: output tensor ``OUTPUT{i}`` is
input tensor ``i`` (same shape, datatype and data: ``raw_input_contents`` back as
``raw_output_contents``, or typed ``contents`` back as they came); only the requested
outputs when the request lists some. The response names ``model_name``,
``model_version`` (the request's, else "1") and the request's ``id``.

  ModelInfer        unary. A model named ``missing`` fails with NOT_FOUND. Request
                    parameters: ``mock_delay_ms`` (int) delays the answer.
  ModelStreamInfer  bidirectional: each request is answered in the stream, like a decoupled
                    model: ``mock_responses`` (int, default 1) responses, the first after
                    ``mock_delay_ms``, the next ``mock_token_delay_ms`` apart, the last with
                    the ``triton_final_response`` parameter; then, when the request sets
                    ``triton_enable_empty_final_response``, an empty final response (no
                    outputs). A model named ``missing`` is answered with an ``error_message``
                    (the stream goes on).
  ServerLive, ServerReady, ModelReady: true. ServerMetadata, ModelMetadata: a mock's.

Prints "listening on PORT" once ready.
"""

from __future__ import annotations

import argparse
import time
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc


def _param(request, name: str, default: int = 0) -> int:
    if name not in request.parameters:
        return default
    value = request.parameters[name]
    kind = value.WhichOneof("parameter_choice")
    numeric = ("int64_param", "uint64_param", "bool_param", "double_param")
    return int(getattr(value, kind)) if kind in numeric else default


def infer(request) -> service_pb2.ModelInferResponse:
    """The identity model's answer to one ModelInferRequest."""
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version or "1", id=request.id
    )
    raw = list(request.raw_input_contents)
    wanted = [output.name for output in request.outputs] or [f"OUTPUT{i}" for i in range(len(request.inputs))]
    for position, name in enumerate(wanted):
        index = int(name[6:]) if name.startswith("OUTPUT") and name[6:].isdigit() else position
        if index >= len(request.inputs):
            continue
        tensor = request.inputs[index]
        output = response.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            response.raw_output_contents.append(raw[index] if index < len(raw) else b"")
        else:
            output.contents.CopyFrom(tensor.contents)
    return response


class MockInferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=True)

    def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name="triton-grpc-mock", version="2.0.0", extensions=[])

    def ModelMetadata(self, request, context):
        return service_pb2.ModelMetadataResponse(name=request.name, versions=["1"], platform="mock")

    def ModelInfer(self, request, context):
        if request.model_name == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.model_name}' is not found")
        delay = _param(request, "mock_delay_ms")
        if delay:
            time.sleep(delay / 1000.0)
        return infer(request)

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            if request.model_name == "missing":
                yield service_pb2.ModelStreamInferResponse(
                    error_message=f"Request for unknown model: '{request.model_name}' is not found"
                )
                continue
            count = max(_param(request, "mock_responses", 1), 1)
            delay, gap = _param(request, "mock_delay_ms"), _param(request, "mock_token_delay_ms")
            for number in range(count):
                pause = delay if number == 0 else gap
                if pause:
                    time.sleep(pause / 1000.0)
                response = infer(request)
                response.parameters["triton_final_response"].bool_param = number == count - 1
                yield service_pb2.ModelStreamInferResponse(infer_response=response)
            if _param(request, "triton_enable_empty_final_response"):
                empty = service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version or "1", id=request.id
                )
                empty.parameters["triton_final_response"].bool_param = True
                yield service_pb2.ModelStreamInferResponse(infer_response=empty)


def serve(host: str, port: int) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(MockInferenceService(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server, port = serve(args.host, args.port)
    print(f"listening on {port}", flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    main()
