"""Client for the cross-node tests: LLM calls with the real ``openai`` SDK, or
plain HTTPS requests with urllib, against examples/openai_mock_server.py.

  llm_calls.py openai BASE_URL [--stream] [--count N] [--cafile PEM]
  llm_calls.py https BASE_URL [--count N] --cafile PEM

Prints one line per call: "ok <what>" (the SDK's streamed text, or the HTTP status).
With ``--gate FILE`` it loads its libraries (OpenSSL included), prints
"listening on 0" and waits for FILE to exist before calling (so that an agent
has attached its TLS probes to it first); ``--out FILE`` writes the lines there.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.request


def openai_calls(base_url: str, count: int, stream: bool, cafile: str | None, say) -> None:
    import httpx
    from openai import OpenAI

    http_client = httpx.Client(verify=cafile) if cafile else None
    client = OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=60, http_client=http_client)
    yield
    for i in range(count):
        messages = [{"role": "user", "content": f"question {i}"}]
        if stream:
            chunks = client.chat.completions.create(model="mock-llm", messages=messages, stream=True, max_tokens=8)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        else:
            text = client.chat.completions.create(model="mock-llm", messages=messages, max_tokens=8).choices[0].message.content
        say(f"ok {text!r}")


def https_calls(base_url: str, count: int, cafile: str, say) -> None:
    """POST /chat/completions with urllib (CPython's ssl on the socket: OpenSSL's SSL_write_ex)."""
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = False
    yield
    for i in range(count):
        body = json.dumps({"model": "mock-llm", "messages": [{"role": "user", "content": f"q{i}"}]}).encode()
        request = urllib.request.Request(f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            response.read()
            say(f"ok {response.status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=("openai", "https"))
    parser.add_argument("target")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--cafile")
    parser.add_argument("--gate", help="wait for this file before calling (after printing 'listening on 0')")
    parser.add_argument("--out", help="write the result lines here (default: stdout)")
    args = parser.parse_args()
    out = open(args.out, "a") if args.out else sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    if args.kind == "openai":
        calls = openai_calls(args.target, args.count, args.stream, args.cafile, say)
    else:
        calls = https_calls(args.target, args.count, args.cafile, say)
    next(calls)  # set up: libraries loaded, nothing sent yet
    if args.gate:
        print("listening on 0", flush=True)
        while not os.path.exists(args.gate):
            time.sleep(0.05)
    for _ in calls:
        pass
    say("done")


if __name__ == "__main__":
    main()
