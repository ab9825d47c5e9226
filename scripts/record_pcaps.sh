#!/usr/bin/env bash
# Record the capture files that tests/test_pcap_source.py and
# tests/test_golden.py replay, into tests/data/ and tests/golden/. This script
# is the source of truth for how each was made (tests/data/README.md and
# tests/golden/README.md summarise it). Run as root: tcpdump needs it.
#
#   sudo bash scripts/record_pcaps.sh                    # every capture
#   sudo bash scripts/record_pcaps.sh gateway udp_echo   # only these (names below, no .pcap)
#
# Every capture is real traffic on the loopback interface between a real
# server and curl. Response bodies are generated deterministically
# (make_body below; the tests rebuild the same bytes) and curl sends a fixed
# User-Agent, so the tests can compare reassembled streams byte for byte.
#
#   http_get.pcap          python3 -m http.server (HTTP/1.0): GET /small.txt (200)
#                          and GET /missing.txt (404), two connections
#   http_keepalive.pcap    python3 -m http.server -p HTTP/1.1: one curl with three
#                          URLs, so three requests on one kept-alive connection
#   http_post_chunked.pcap a small echo server: POST with a chunked body that curl
#                          streams from a pipe in three parts, echoed back
#   nginx_large.pcap       nginx: GET /large.txt, a 48000-byte body written in
#                          8 KB buffers, so several segments
#   http_ipv6.pcap         python3 -m http.server bound to ::1: GET /small.txt
#   snaplen200.pcap        as nginx_large.pcap but tcpdump -s 200: every segment
#                          is cut to 200 bytes, so bodies are truncated
#   sll.pcap, sll2.pcap    tcpdump -i any with -y LINUX_SLL / LINUX_SLL2: the
#                          http.server GET /small.txt, in Linux cooked framing
#   udp_echo.pcap          a UDP echo server and a client sending three datagrams
#   gateway.pcap           (tests/golden/http1/) examples/http_gateway.py in front
#                          of examples/http_backend.py, driven by curl: call
#                          chains, for the golden tests
#   grpc_calls.pcap        (tests/golden/http2/) examples/grpc_service.py: one
#                          channel, unary, server-streaming, client-streaming,
#                          bidi and a NOT_FOUND call
#   grpc_concurrent.pcap   (tests/golden/http2/) 20 concurrent unary calls on one channel
#   h2c_nginx.pcap         (tests/golden/http2/) nginx serving HTTP/2 in cleartext
#                          (prior knowledge), curl --http2-prior-knowledge: GET
#                          /small.txt (200) and /missing.txt (404), two connections
#   grpc_late.pcap         (tests/golden/http2/) the capture starts after the
#                          channel's first call (no preface, an HPACK table it
#                          never saw): Predict, StreamTokens, Upload, Predict
#   openai.pcap            (tests/golden/http1/) the openai Python SDK against
#                          examples/openai_mock_server.py: chat, chat streamed
#                          with usage, legacy completion streamed, embeddings
#   openai_responses.pcap  (tests/golden/http1/) the openai Python SDK's Responses API
#                          against the same mock's /v1/responses: an answer, a stream
#   ollama.pcap            (tests/golden/http1/) the ollama Python client against the same
#                          mock's /api/*: chat, chat streamed (NDJSON), generate, embed
#   anthropic.pcap         (tests/golden/http1/) the anthropic Python SDK against the
#                          same mock's /v1/messages: a message, and a stream with a
#                          cache_control system block (cache read tokens)
#   rerank.pcap            (tests/golden/http1/) httpx against the same mock:
#                          /v1/rerank (top_n), /rerank, /v1/score
#   tgi.pcap               (tests/golden/http1/) huggingface_hub's InferenceClient
#                          text_generation against the same mock's TGI routes (POST /,
#                          streamed and not, details), then httpx: /generate with
#                          decoder_input_details, /generate_stream
#   triton.pcap            (tests/golden/http1/) tritonclient.http against
#                          examples/triton_mock_server.py: binary tensor data (the
#                          Inference-Header-Content-Length extension), JSON tensors on a
#                          versioned model path, an unknown model (400)
#   triton_grpc.pcap       (tests/golden/http2/) tritonclient.grpc against
#                          examples/triton_grpc_mock_server.py, one channel: ModelInfer
#                          (raw tensors, a versioned model, an unknown model: NOT_FOUND),
#                          then ModelStreamInfer: three responses and an empty final one,
#                          and an unknown model's error_message in the stream
#   gemini.pcap            (tests/golden/http1/) the google-genai SDK against
#                          examples/gemini_mock_server.py: generate_content, a stream
#                          (alt=sse), embed_content (batchEmbedContents), then httpx: a
#                          stream without alt=sse (a JSON array), embedContent, an unknown model
#   bedrock.pcap           (tests/golden/http1/) boto3's bedrock-runtime client against
#                          examples/bedrock_mock_server.py: converse (a cachePoint), converse_stream,
#                          invoke_model (Meta Llama), invoke_model_with_response_stream
#                          (Anthropic), an unknown model (404)
#
# The gRPC captures need grpcio: GRPC_PYTHON (default .venv/bin/python) runs them.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/tests/data"
golden="$here/tests/golden"
py=/usr/bin/python3
grpc_py=${GRPC_PYTHON:-$here/.venv/bin/python}
user_agent="otelbpf-pcap-recorder"
work=$(mktemp -d)
server_pids=()
tcpdump_pid=""

cleanup() {
    [ -n "$tcpdump_pid" ] && kill -INT "$tcpdump_pid" 2>/dev/null || true
    for pid in "${server_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

say() { printf 'record_pcaps: %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "record_pcaps: must run as root (tcpdump)" >&2
    exit 1
fi

# make_body NAME SIZE: lines "NAME line 00000\n", ... cut to SIZE bytes.
# tests/test_pcap_source.py:make_body builds the same bytes.
make_body() {
    "$py" -c '
import sys
name, size = sys.argv[1], int(sys.argv[2])
body = "".join(f"{name} line {i:05d}\n" for i in range(size // 10 + 1))[:size]
sys.stdout.write(body)' "$1" "$2"
}

mkdir -p "$out" "$golden/http1" "$work/www"
chmod 755 "$work" "$work/www"
make_body small 2000 >"$work/www/small.txt"
make_body a 300 >"$work/www/a.txt"
make_body b 5000 >"$work/www/b.txt"
make_body c 100 >"$work/www/c.txt"
make_body large 48000 >"$work/www/large.txt"

# wait_for_port PORT: until something listens on it.
wait_for_port() {
    for _ in $(seq 100); do
        if ss -Htln "sport = :$1" | grep -q .; then return 0; fi
        sleep 0.05
    done
    echo "record_pcaps: nothing listens on port $1" >&2
    exit 1
}

# capture_path FILE: tests/data/FILE, or tests/golden/REST for FILE golden/REST.
capture_path() {
    case $1 in
    golden/*) echo "$golden/${1#golden/}" ;;
    *) echo "$out/$1" ;;
    esac
}

# start_capture FILE FILTER [TCPDUMP-ARGS...]: tcpdump on lo unless -i is given.
start_capture() {
    local file=$1 filter=$2
    shift 2
    local args=(-i lo)
    [[ " $* " == *" -i "* ]] && args=()
    rm -f "$(capture_path "$file")"
    tcpdump "${args[@]}" "$@" -Z root --immediate-mode -U -w "$(capture_path "$file")" "$filter" 2>"$work/tcpdump.log" &
    tcpdump_pid=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$work/tcpdump.log" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "record_pcaps: tcpdump did not start: $(cat "$work/tcpdump.log")" >&2
    exit 1
}

stop_capture() {
    sleep 1  # let the last FIN/ACKs through the capture ring
    kill -INT "$tcpdump_pid"
    wait "$tcpdump_pid" || true
    tcpdump_pid=""
    say "$(ls -l "$(capture_path "$1")" | awk '{print $5}') bytes  $1 ($(grep captured "$work/tcpdump.log"))"
}

start_server() {
    "$@" >/dev/null 2>&1 &
    server_pids+=($!)
}

curl_() { curl -sS --fail-with-body -A "$user_agent" "$@"; }

# --- servers -----------------------------------------------------------------
start_server "$py" -m http.server 18080 --bind 127.0.0.1 --directory "$work/www"
start_server "$py" -m http.server 18081 --bind 127.0.0.1 --directory "$work/www" -p HTTP/1.1
start_server "$py" -m http.server 18083 --bind ::1 --directory "$work/www"

# Echo server: reads a chunked (or sized) request body, answers it back.
cat >"$work/echo_server.py" <<'EOF'
import http.server


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                body += self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", 18084), Echo).serve_forever()
EOF
start_server "$py" "$work/echo_server.py"

mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
master_process off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $work/nginx;
    proxy_temp_path $work/nginx;
    fastcgi_temp_path $work/nginx;
    uwsgi_temp_path $work/nginx;
    scgi_temp_path $work/nginx;
    default_type text/plain;
    server_tokens off;
    # Written from user space in 8 KB buffers, so the body crosses the wire
    # in several segments (sendfile would hand it to the kernel whole).
    sendfile off;
    output_buffers 1 8k;
    server {
        listen 127.0.0.1:18082;
        root $work/www;
    }
    server {
        listen 127.0.0.1:18088 http2;
        root $work/www;
    }
}
EOF
start_server nginx -p "$work/nginx" -c "$work/nginx/nginx.conf"

# The example services: a gateway on 18085 calling a backend on 18086.
start_server "$py" "$here/examples/http_backend.py" --port 18086 --delay-ms 1
start_server "$py" "$here/examples/http_gateway.py" --port 18085 --backend 127.0.0.1:18086

# UDP echo server on 127.0.0.1:18090: answers each datagram with "echo: " + it.
start_server "$py" -c '
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 18090))
while True:
    data, peer = sock.recvfrom(65535)
    sock.sendto(b"echo: " + data, peer)'

# The OpenAI-compatible mock on 18089: 40 ms to the first token, 5 ms between tokens.
start_server "$py" "$here/examples/openai_mock_server.py" --port 18089 --first-token-delay-ms 40 --token-delay-ms 5
# The v2 inference protocol (Triton / KServe) mock on 18091.
start_server "$py" "$here/examples/triton_mock_server.py" --port 18091
# The v2 inference protocol over gRPC (Triton / KServe) mock on 18092.
start_server "$grpc_py" "$here/examples/triton_grpc_mock_server.py" --port 18092
# The Gemini API mock on 18093 and the Bedrock Runtime mock on 18094 (same delays as 18089's).
start_server "$py" "$here/examples/gemini_mock_server.py" --port 18093 --first-token-delay-ms 40 --token-delay-ms 5
start_server "$py" "$here/examples/bedrock_mock_server.py" --port 18094 --first-token-delay-ms 40 --token-delay-ms 5
# The example gRPC service on 18087.
start_server "$grpc_py" "$here/examples/grpc_service.py" serve --port 18087

for port in 18080 18081 18082 18083 18084 18085 18086 18087 18088 18089 18091 18092 18093 18094; do wait_for_port "$port"; done

# --- captures: record_NAME makes NAME.pcap ---------------------------------------

record_http_get() {
    start_capture http_get.pcap "tcp port 18080"
    curl_ -o /dev/null http://127.0.0.1:18080/small.txt
    curl -sS -A "$user_agent" -o /dev/null http://127.0.0.1:18080/missing.txt
    stop_capture http_get.pcap
}

record_http_keepalive() {
    start_capture http_keepalive.pcap "tcp port 18081"
    curl_ -o /dev/null -o /dev/null -o /dev/null \
        http://127.0.0.1:18081/a.txt http://127.0.0.1:18081/b.txt http://127.0.0.1:18081/c.txt
    stop_capture http_keepalive.pcap
}

record_http_post_chunked() {
    start_capture http_post_chunked.pcap "tcp port 18084"
    { printf 'first part\n'; sleep 0.2; printf 'second part\n'; sleep 0.2; printf 'third part\n'; } |
        curl_ -o /dev/null -X POST -T - -H "Expect:" -H "Content-Type: text/plain" http://127.0.0.1:18084/echo
    stop_capture http_post_chunked.pcap
}

record_nginx_large() {
    start_capture nginx_large.pcap "tcp port 18082"
    curl_ -o /dev/null http://127.0.0.1:18082/large.txt
    stop_capture nginx_large.pcap
}

record_http_ipv6() {
    start_capture http_ipv6.pcap "tcp port 18083"
    curl_ -g -o /dev/null "http://[::1]:18083/small.txt"
    stop_capture http_ipv6.pcap
}

record_snaplen200() {
    start_capture snaplen200.pcap "tcp port 18082" -s 200
    curl_ -o /dev/null http://127.0.0.1:18082/large.txt
    stop_capture snaplen200.pcap
}

record_sll() {
    start_capture sll.pcap "tcp port 18080" -i any -y LINUX_SLL
    curl_ -o /dev/null http://127.0.0.1:18080/small.txt
    stop_capture sll.pcap
}

record_sll2() {
    start_capture sll2.pcap "tcp port 18080" -i any -y LINUX_SLL2
    curl_ -o /dev/null http://127.0.0.1:18080/small.txt
    stop_capture sll2.pcap
}

record_udp_echo() {
    for _ in $(seq 100); do ss -Huln "sport = :18090" | grep -q . && break; sleep 0.05; done
    start_capture udp_echo.pcap "udp port 18090"
    "$py" -c '
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(5)
for message in (b"ping 1", b"ping 2", b"x" * 3000):
    sock.sendto(message, ("127.0.0.1", 18090))
    sock.recvfrom(65535)'
    stop_capture udp_echo.pcap
}

# Four calls through the gateway, each a curl connection (one handler thread,
# so one backend connection each): a GET with a W3C traceparent from an
# upstream caller, a POST, a GET that the backend fails (500, answered 502),
# and a plain GET.
record_gateway() {
    start_capture golden/http1/gateway.pcap "tcp port 18085 or tcp port 18086"
    curl_ -o /dev/null -H "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" \
        http://127.0.0.1:18085/api/items/7
    curl_ -o /dev/null -X POST -H "Content-Type: application/json" -d '{"input": [1, 2, 3]}' \
        http://127.0.0.1:18085/api/predict
    curl -sS -A "$user_agent" -o /dev/null http://127.0.0.1:18085/api/error
    curl_ -o /dev/null http://127.0.0.1:18085/api/items/8
    stop_capture golden/http1/gateway.pcap
}

# The real openai SDK (the project venv has it), one client, one kept-alive
# connection: what an LLM gateway or agent sends to vLLM / an OpenAI endpoint.
record_openai() {
    start_capture golden/http1/openai.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:18089/v1", api_key="sk-golden-not-a-secret", max_retries=0)
messages = [{"role": "user", "content": "say hello to the golden tests"}]
client.chat.completions.create(model="llama-3-8b", messages=messages, max_tokens=4, temperature=0.2)
for _ in client.chat.completions.create(model="llama-3-8b", messages=messages, max_tokens=6, stream=True,
                                       stream_options={"include_usage": True}, top_p=0.9):
    pass
for _ in client.completions.create(model="llama-3-8b", prompt="once upon a time", max_tokens=3, stream=True):
    pass
client.embeddings.create(model="bge-small", input=["first text", "second text"])'
    stop_capture golden/http1/openai.pcap
}

# The real anthropic SDK (the project venv has it) against the mock's /v1/messages.
record_anthropic() {
    start_capture golden/http1/anthropic.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
import anthropic
client = anthropic.Anthropic(base_url="http://127.0.0.1:18089", api_key="sk-ant-golden-not-a-secret", max_retries=0)
client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "say hello to the golden tests"}])
system = [{"type": "text", "text": "you are a cached golden system prompt", "cache_control": {"type": "ephemeral"}}]
with client.messages.stream(model="claude-haiku-4-5", max_tokens=6, system=system, extra_body={"mock_output_tokens": 6},
                            messages=[{"role": "user", "content": "stream to the golden tests"}]) as stream:
    for _ in stream.text_stream:
        pass'
    stop_capture golden/http1/anthropic.pcap
}

# OpenAI's Responses API: the real openai SDK against the mock's /v1/responses (one answer cut
# at max_output_tokens, one stream with instructions).
record_openai_responses() {
    start_capture golden/http1/openai_responses.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
import openai
client = openai.OpenAI(base_url="http://127.0.0.1:18089/v1", api_key="sk-golden-not-a-secret", max_retries=0)
client.responses.create(model="gpt-4.1-mini", input="say hello to the golden tests", max_output_tokens=3, temperature=0.2)
with client.responses.stream(model="gpt-4.1-mini", input="stream to the golden tests", instructions="be brief") as stream:
    for _ in stream:
        pass'
    stop_capture golden/http1/openai_responses.pcap
}

# Ollama's own API: the real ollama Python client against the mock's /api/* routes (a chat,
# a streamed chat, a generate, embeddings), one client.
record_ollama() {
    start_capture golden/http1/ollama.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
import ollama
client = ollama.Client(host="http://127.0.0.1:18089")
client.chat(model="llama3.2", messages=[{"role": "user", "content": "say hello to the golden tests"}],
            options={"num_predict": 3, "temperature": 0.2}, stream=False)
for _ in client.chat(model="llama3.2", messages=[{"role": "user", "content": "stream to the golden tests"}], stream=True):
    pass
client.generate(model="llama3.2", prompt="once upon a golden time", options={"num_predict": 2}, stream=False)
client.embed(model="nomic-embed-text", input=["first text", "second text"])'
    stop_capture golden/http1/ollama.pcap
}

# Rerank and score calls (vLLM / Jina shapes) with httpx, one kept-alive connection.
record_rerank() {
    start_capture golden/http1/rerank.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
import httpx
http = httpx.Client(base_url="http://127.0.0.1:18089")
documents = ["eBPF runs sandboxed programs in the kernel", "a banana is a fruit", "tracing without code changes"]
http.post("/v1/rerank", json={"model": "bge-reranker-v2-m3", "query": "what is eBPF", "documents": documents, "top_n": 2})
http.post("/rerank", json={"model": "bge-reranker-v2-m3", "query": "what is eBPF", "documents": documents,
                           "return_documents": False})
http.post("/v1/score", json={"model": "bge-reranker-v2-m3", "text_1": "what is eBPF", "text_2": documents})'
    stop_capture golden/http1/rerank.pcap
}

# Hugging Face TGI's native API: the real huggingface_hub client (it posts to TGI's
# compatibility route /), then httpx on /generate and /generate_stream; one connection each.
record_tgi() {
    start_capture golden/http1/tgi.pcap "tcp port 18089"
    "$here/.venv/bin/python" -c '
import httpx
from huggingface_hub import InferenceClient
client = InferenceClient(model="http://127.0.0.1:18089")
client.text_generation("say hello to the golden tests", max_new_tokens=3, details=True, temperature=0.2)
for _ in client.text_generation("stream to the golden tests", details=True, stream=True):
    pass
http = httpx.Client(base_url="http://127.0.0.1:18089")
http.post("/generate", json={"inputs": "golden prefill words", "parameters": {"max_new_tokens": 2, "details": True,
                                                                              "decoder_input_details": True}})
http.post("/generate_stream", json={"inputs": "golden stream", "parameters": {"max_new_tokens": 4, "top_p": 0.9}})'
    stop_capture golden/http1/tgi.pcap
}

# The v2 inference protocol: the real tritonclient.http (geventhttpclient), one connection.
record_triton() {
    start_capture golden/http1/triton.pcap "tcp port 18091"
    "$here/.venv/bin/python" -c '
import numpy as np
import tritonclient.http as httpclient
client = httpclient.InferenceServerClient(url="127.0.0.1:18091")
a = np.arange(8, dtype=np.int32).reshape(1, 8)
i0 = httpclient.InferInput("INPUT0", [1, 8], "INT32"); i0.set_data_from_numpy(a)
i1 = httpclient.InferInput("INPUT1", [1, 8], "INT32"); i1.set_data_from_numpy(a)
client.infer("simple", [i0, i1], request_id="golden-binary",
             outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True), httpclient.InferRequestedOutput("OUTPUT1")])
j0 = httpclient.InferInput("INPUT0", [1, 8], "INT32"); j0.set_data_from_numpy(a, binary_data=False)
client.infer("simple", [j0], model_version="2", request_id="golden-json",
             outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
try:
    client.infer("missing", [j0])
except Exception:
    pass'
    stop_capture golden/http1/triton.pcap
}

# Google's Gemini API: the real google-genai SDK (one client), then httpx for what the SDK
# does not send: the stream without alt=sse (a JSON array), embedContent, an unknown model.
record_gemini() {
    start_capture golden/http1/gemini.pcap "tcp port 18093"
    "$here/.venv/bin/python" -c '
import httpx
from google import genai
from google.genai import types
client = genai.Client(api_key="golden-not-a-secret", http_options=types.HttpOptions(base_url="http://127.0.0.1:18093",
                                                                                     api_version="v1beta"))
client.models.generate_content(model="gemini-2.0-flash", contents="say hello to the golden tests",
                               config=types.GenerateContentConfig(max_output_tokens=4, temperature=0.2,
                                                                  system_instruction="be brief"))
for _ in client.models.generate_content_stream(model="gemini-2.0-flash", contents="stream to the golden tests",
                                               config=types.GenerateContentConfig(top_p=0.9)):
    pass
client.models.embed_content(model="text-embedding-004", contents=["first text", "second text"])
http = httpx.Client(base_url="http://127.0.0.1:18093")
body = {"contents": [{"role": "user", "parts": [{"text": "an array stream"}]}], "generationConfig": {"maxOutputTokens": 3}}
with http.stream("POST", "/v1/models/gemini-2.5-flash:streamGenerateContent", json=body) as answer:
    answer.read()
http.post("/v1beta/models/text-embedding-004:embedContent", json={"content": {"parts": [{"text": "one text"}]}})
http.post("/v1beta/models/missing:generateContent", json=body)'
    stop_capture golden/http1/gemini.pcap
}

# AWS Bedrock Runtime: the real boto3 client (dummy credentials, no retries), one client.
record_bedrock() {
    start_capture golden/http1/bedrock.pcap "tcp port 18094"
    "$here/.venv/bin/python" -c '
import json
import boto3
from botocore.config import Config
client = boto3.client("bedrock-runtime", endpoint_url="http://127.0.0.1:18094", region_name="us-east-1",
                      aws_access_key_id="AKIDGOLDEN", aws_secret_access_key="golden-not-a-secret",
                      config=Config(retries={"max_attempts": 1}))
model = "anthropic.claude-3-haiku-20240307-v1:0"
client.converse(modelId=model, messages=[{"role": "user", "content": [{"text": "say hello to the golden tests"}]}],
                system=[{"text": "a cached golden system prompt"}, {"cachePoint": {"type": "default"}}],
                inferenceConfig={"maxTokens": 4, "temperature": 0.2})
answer = client.converse_stream(modelId=model, messages=[{"role": "user", "content": [{"text": "stream to the golden tests"}]}])
for _ in answer["stream"]:
    pass
client.invoke_model(modelId="meta.llama3-8b-instruct-v1:0",
                    body=json.dumps({"prompt": "once upon a golden time", "max_gen_len": 3, "top_p": 0.9}))
answer = client.invoke_model_with_response_stream(modelId=model, body=json.dumps(
    {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 4, "messages": [{"role": "user", "content": "stream"}]}))
for _ in answer["body"]:
    pass
try:
    client.converse(modelId="missing", messages=[{"role": "user", "content": [{"text": "x"}]}])
except client.exceptions.ResourceNotFoundException:
    pass'
    stop_capture golden/http1/bedrock.pcap
}

mkdir -p "$golden/http2"

record_grpc_calls() {
    start_capture golden/http2/grpc_calls.pcap "tcp port 18087"
    "$grpc_py" "$here/examples/grpc_service.py" call --port 18087 --mode all >/dev/null
    stop_capture golden/http2/grpc_calls.pcap
}

record_grpc_concurrent() {
    start_capture golden/http2/grpc_concurrent.pcap "tcp port 18087"
    "$grpc_py" "$here/examples/grpc_service.py" call --port 18087 --mode concurrent --count 20 >/dev/null
    stop_capture golden/http2/grpc_concurrent.pcap
}

record_h2c_nginx() {
    start_capture golden/http2/h2c_nginx.pcap "tcp port 18088"
    # Two connections: curl 7.88 fails the second request on a reused prior-knowledge one.
    curl_ --http2-prior-knowledge -o /dev/null http://127.0.0.1:18088/small.txt
    curl -sS -A "$user_agent" --http2-prior-knowledge -o /dev/null http://127.0.0.1:18088/missing.txt
    stop_capture golden/http2/h2c_nginx.pcap
}

# The client (mode wait) makes one call, prints "ready", then one round per stdin line.
record_grpc_late() {
    mkfifo "$work/grpc_in"
    "$grpc_py" "$here/examples/grpc_service.py" call --port 18087 --mode wait <"$work/grpc_in" >"$work/grpc_out" &
    local client=$!
    exec 3>"$work/grpc_in"
    for _ in $(seq 200); do grep -q ready "$work/grpc_out" 2>/dev/null && break; sleep 0.05; done
    start_capture golden/http2/grpc_late.pcap "tcp port 18087"
    echo go >&3
    for _ in $(seq 200); do grep -q done "$work/grpc_out" 2>/dev/null && break; sleep 0.05; done
    exec 3>&-
    wait "$client"
    stop_capture golden/http2/grpc_late.pcap
}

# The v2 inference protocol over gRPC: the real tritonclient.grpc, one channel (one connection).
record_triton_grpc() {
    start_capture golden/http2/triton_grpc.pcap "tcp port 18092"
    "$grpc_py" -c '
import queue
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(url="127.0.0.1:18092")
a = np.arange(8, dtype=np.int32).reshape(1, 8)
i0 = grpcclient.InferInput("INPUT0", [1, 8], "INT32"); i0.set_data_from_numpy(a)
i1 = grpcclient.InferInput("INPUT1", [1, 8], "INT32"); i1.set_data_from_numpy(a)
client.infer("simple", [i0, i1], request_id="golden-unary", outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
client.infer("simple", [i0], model_version="2", request_id="golden-versioned")
try:
    client.infer("missing", [i0])
except Exception:
    pass
answers = queue.Queue()
client.start_stream(callback=lambda result, error: answers.put((result, error)))
client.async_stream_infer("llm", [i0], request_id="golden-stream", enable_empty_final_response=True,
                          parameters={"mock_responses": 3, "mock_delay_ms": 40, "mock_token_delay_ms": 5})
client.async_stream_infer("missing", [i0], request_id="golden-stream-error")
for _ in range(5):
    answers.get(timeout=10)
client.stop_stream()
client.close()'
    stop_capture golden/http2/triton_grpc.pcap
}

all_captures=(http_get http_keepalive http_post_chunked nginx_large http_ipv6 snaplen200 sll sll2 udp_echo gateway
    grpc_calls grpc_concurrent grpc_late h2c_nginx openai openai_responses anthropic ollama rerank tgi triton triton_grpc
    gemini bedrock)
[ $# -gt 0 ] || set -- "${all_captures[@]}"
for name in "$@"; do
    if ! declare -F "record_$name" >/dev/null; then
        echo "record_pcaps: no capture named $name (known: ${all_captures[*]})" >&2
        exit 2
    fi
done
for name in "$@"; do "record_$name"; done
