"""Test client: N requests over one keep-alive connection (requests.Session).

Waits for a line on stdin before starting, so the agent can be attached to
its pid first. Prints one status per line, then "done".
With --early, the connection is opened (one GET of URL_PREFIX + "early")
before "ready": it predates an agent attached then.
Usage: keepalive_client.py URL_PREFIX COUNT [--post] [--early]
"""

import sys

import requests


def main() -> None:
    prefix, count = sys.argv[1], int(sys.argv[2])
    post = "--post" in sys.argv
    session = requests.Session()
    if "--early" in sys.argv:
        print("early", session.get(f"{prefix}early").status_code, flush=True)
    print("ready", flush=True)
    sys.stdin.readline()
    with session:
        for i in range(count):
            if post:
                response = session.post(f"{prefix}", json={"i": i, "text": "x" * 100})
            else:
                response = session.get(f"{prefix}{i}")
            print(response.status_code, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
