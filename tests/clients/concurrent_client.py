"""Sends COUNT GET requests, CONCURRENCY at a time, each for /api/items/<unique id>.

Usage: concurrent_client.py BASE_URL COUNT CONCURRENCY. Prints the number of
200 responses. Each request has its own id, so a test can tell which backend
call belongs to which request.
"""

import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests


def main() -> None:
    base, count, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ids = [uuid.uuid4().hex for _ in range(count)]

    def fetch(item_id: str) -> int:
        return requests.get(f"{base}/api/items/{item_id}", timeout=60).status_code

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        statuses = list(pool.map(fetch, ids))
    print(sum(status == 200 for status in statuses), flush=True)


if __name__ == "__main__":
    main()
