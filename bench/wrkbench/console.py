"""What a bench run tells its user: progress lines as they happen, and the error that ends a run.

Progress is flushed line by line so a run piped to a file or watched over ssh shows each window
as it finishes; ``BenchError`` carries a message that says what to do, printed without a traceback.
"""

from __future__ import annotations


class BenchError(RuntimeError):
    """A precondition or a child process failed; the message says what to do."""


def say(text: str = "") -> None:
    print(text, flush=True)
