"""Test client: COUNT GETs of HOST:PORT/items/<i> on one keep-alive connection
(http.client), pausing after the first until the file GATE exists (the test
changes something on the path meanwhile). Prints "listening on 0" when started,
writes one status per request then "done" to OUT.

Usage: stepped_client.py HOST PORT COUNT GATE OUT
"""

import http.client
import os
import sys
import time


def main() -> None:
    host, port, count, gate, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    print("listening on 0", flush=True)
    connection = http.client.HTTPConnection(host, port, timeout=30)
    with open(out, "a") as results:
        for i in range(count):
            if i == 1:
                while not os.path.exists(gate):
                    time.sleep(0.05)
            connection.request("GET", f"/items/{i}")
            response = connection.getresponse()
            response.read()
            results.write(f"{response.status}\n")
            results.flush()
        results.write("done\n")
    connection.close()


if __name__ == "__main__":
    main()
