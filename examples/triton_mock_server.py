"""A deterministic v2 inference protocol server (Triton / KServe over HTTP), for the demo
and the tests (stdlib only).

Routes:

  POST /v2/models/{name}[/versions/{version}]/infer
        an identity model: output tensor ``OUTPUT{i}`` is input tensor ``i`` (same
        shape, datatype and data), so any client's request is answered; the response
        names ``model_name``, ``model_version`` (the path's, else "1") and the request's
        ``id``. With the binary tensor data extension (an ``Inference-Header-Content-
        Length`` request header) inputs are read from the bytes after the JSON head;
        outputs are sent as binary (after a JSON head, the header set on the response)
        when the request asks for it (an output's ``parameters.binary_data``, or
        ``parameters.binary_data_output``), else as JSON ``data``. Only the requested
        outputs are returned when the request lists some. ``mock_delay_ms`` in the
        request parameters delays the answer. A model named ``missing`` is a 400 error.
  GET  /v2/health/ready, /v2/health/live, /v2/models/{name}[/versions/{v}]/ready: 200
  GET  /v2, /v2/models/{name}: the server's / the model's metadata

Prints "listening on PORT" once ready.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


def parse_infer_path(path: str) -> tuple[str, str | None] | None:
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1:
        return unquote(parts[0]), None
    if len(parts) == 3 and parts[1] == "versions":
        return unquote(parts[0]), parts[2]
    return None


class TritonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, status: int, payload: dict, binary: bytes = b"") -> None:
        head = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        if binary:
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Inference-Header-Content-Length", str(len(head)))
        else:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(head) + len(binary)))
        self.end_headers()
        self.wfile.write(head + binary)

    def do_GET(self):
        path = self.path.partition("?")[0]
        if path in ("/v2/health/ready", "/v2/health/live") or path.endswith("/ready"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/v2":
            self._send(200, {"name": "triton-mock", "version": "2.0.0", "extensions": ["binary_tensor_data"]})
        elif path.startswith("/v2/models/"):
            name = unquote(path[len("/v2/models/") :].split("/")[0])
            self._send(200, {"name": name, "versions": ["1"], "platform": "mock", "inputs": [], "outputs": []})
        else:
            self._send(404, {"error": f"no route {path}"})

    def do_POST(self):
        path = self.path.partition("?")[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        target = parse_infer_path(path)
        if target is None:
            self._send(404, {"error": f"no route {path}"})
            return
        name, version = target
        head_size = self.headers.get("Inference-Header-Content-Length")
        head_len = int(head_size) if head_size else len(body)
        try:
            request = json.loads(body[:head_len] or b"{}")
        except ValueError:
            self._send(400, {"error": "failed to parse the request JSON"})
            return
        if name == "missing":
            self._send(400, {"error": f"Request for unknown model: '{name}' is not found"})
            return
        params = request.get("parameters") or {}
        if isinstance(params.get("mock_delay_ms"), (int, float)):
            time.sleep(params["mock_delay_ms"] / 1000.0)
        binary_in = body[head_len:]
        offset = 0
        tensors = []  # (input, raw bytes or None)
        for tensor in request.get("inputs") or []:
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if isinstance(size, int):
                tensors.append((tensor, binary_in[offset : offset + size]))
                offset += size
            else:
                tensors.append((tensor, None))
        wanted = request.get("outputs")
        all_binary = bool(params.get("binary_data_output"))
        if not wanted:
            wanted = [{"name": f"OUTPUT{i}", "parameters": {"binary_data": all_binary}} for i in range(len(tensors))]
        outputs, binary = [], b""
        for position, spec in enumerate(wanted):
            out_name = str(spec.get("name", f"OUTPUT{position}"))
            index = int(out_name[6:]) if out_name.startswith("OUTPUT") and out_name[6:].isdigit() else position
            if index >= len(tensors):
                continue
            tensor, raw = tensors[index]
            output = {"name": out_name, "datatype": tensor.get("datatype"), "shape": tensor.get("shape")}
            if (spec.get("parameters") or {}).get("binary_data", all_binary) and raw is not None:
                output["parameters"] = {"binary_data_size": len(raw)}
                binary += raw
            elif raw is None:
                output["data"] = tensor.get("data")
            else:  # binary in, JSON out: only for the bytes-free datatypes a mock can decode
                import array

                codes = {"INT32": "i", "FP32": "f", "INT64": "q", "FP64": "d", "UINT8": "B", "INT8": "b"}
                code = codes.get(str(tensor.get("datatype")))
                output["data"] = list(array.array(code, raw)) if code else []
            outputs.append(output)
        response = {"model_name": name, "model_version": version or "1", "outputs": outputs}
        if request.get("id"):
            response["id"] = request["id"]
        self._send(200, response, binary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), TritonHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
