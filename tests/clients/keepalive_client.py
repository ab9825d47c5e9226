"""Test client: N requests over one keep-alive connection (requests.Session).

Waits for a line on stdin before starting, so the agent can be attached to
its pid first. Prints one status per line, then "done".
Usage: keepalive_client.py URL_PREFIX COUNT [--post]
"""

import sys

import requests


def main() -> None:
    prefix, count = sys.argv[1], int(sys.argv[2])
    post = "--post" in sys.argv
    print("ready", flush=True)
    sys.stdin.readline()
    with requests.Session() as session:
        for i in range(count):
            if post:
                response = session.post(f"{prefix}", json={"i": i, "text": "x" * 100})
            else:
                response = session.get(f"{prefix}{i}")
            print(response.status_code, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
