"""doctor says when DDS shared memory is in use (its samples bypass sockets)."""

from __future__ import annotations

from otelbpf.cli.doctor import OK, WARN, check_dds_shared_memory


def test_no_dds_segments_is_ok(tmp_path):
    (tmp_path / "libpod_lock").write_bytes(b"")
    assert check_dds_shared_memory(str(tmp_path)).status == OK


def test_fast_dds_and_iceoryx_segments_are_warned_about(tmp_path):
    (tmp_path / "fastrtps_port7413").write_bytes(b"")
    (tmp_path / "iceoryx_mgmt").write_bytes(b"")
    check = check_dds_shared_memory(str(tmp_path))
    assert check.status == WARN
    assert "Fast DDS shared-memory transport" in check.detail and "iceoryx" in check.detail
    assert "docs/ros2-dds.md" in check.fix
