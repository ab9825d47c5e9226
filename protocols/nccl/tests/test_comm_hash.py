"""commHash of an ncclUniqueId, per NCCL version: known answers computed with NCCL's own getHash
(src/include/bitops.h of v2.30.7 for the accumulator, of v2.25.1 for DJB2a, built for x86-64)."""

from __future__ import annotations

import pytest

from protocols.nccl.comm_hash import accumulator_hash, comm_hash, djb2a_hash, format_comm_hash

VECTORS = [bytes(range(128)), bytes(range(128, 256)), bytes((i * 37 + 11) & 0xFF for i in range(128))]
#: (NCCL >= 2.26, NCCL 2.19-2.25 with signed char) for each vector, from NCCL's C code
KNOWN = [
    (0x6AFE1CC17717E1F4, 0xBF47C767CBDF3105),
    (0x1379339BDC3AFBDC, 0x3758FA770A673905),
    (0x3002DCD1BBE6653D, 0x65BB3B0CBA527185),
]


@pytest.mark.parametrize("vector, known", list(zip(VECTORS, KNOWN)))
def test_both_hashes_give_what_nccl_computes(vector, known):
    assert (accumulator_hash(vector), djb2a_hash(vector)) == known


def test_the_version_picks_the_hash():
    vector = VECTORS[2]
    assert comm_hash(vector) == comm_hash(vector, (2, 30, 7)) == comm_hash(vector, (2, 26, 0)) == KNOWN[2][0]
    assert comm_hash(vector, (2, 25, 1)) == comm_hash(vector, (2, 19, 3)) == KNOWN[2][1]


def test_unsigned_char_changes_the_old_hash_only_for_high_bytes():
    """arm64's char is unsigned: NCCL before 2.26 hashes bytes >= 128 differently there."""
    assert djb2a_hash(VECTORS[0], signed_char=False) == djb2a_hash(VECTORS[0])  # bytes 0..127 only
    assert comm_hash(VECTORS[1], (2, 25, 0), signed_char=False) != comm_hash(VECTORS[1], (2, 25, 0))


def test_the_text_form_is_sixteen_hex_digits():
    assert format_comm_hash(0xAE94423CFBB2EF4A) == "ae94423cfbb2ef4a"
    assert format_comm_hash(0x1F) == "000000000000001f"
