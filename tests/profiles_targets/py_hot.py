"""A CPython target for the profile tests: caller -> hot, hot spinning (lines 10-11).

Keep the line numbers: the test asserts hot's line (HOT_LINES in
tests/test_ebpf_profiles.py).
"""


def hot():
    x = 0
    while True:
        x += 1


def caller():
    hot()


print("ready", flush=True)
caller()
