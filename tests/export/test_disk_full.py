"""A full disk: refused up front when the estimate says so, and a clean error (no half file) when a write fails.

Uses a real 2 MB tmpfs; needs permission to mount (root in CI's sandbox), skipped otherwise."""

import errno
import subprocess

import pytest

from contract.cli import describe_os_error
from contract.files import atomic_write_bytes


@pytest.fixture
def tiny_disk(tmp_path):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): disk-full paths not exercised")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_write_that_fills_the_disk_leaves_nothing_behind(tiny_disk):
    target = tiny_disk / "big.bin"
    with pytest.raises(OSError) as error:
        atomic_write_bytes(target, b"x" * 3_000_000)
    assert error.value.errno == errno.ENOSPC
    assert list(tiny_disk.iterdir()) == []
    assert "disk full" in describe_os_error(error.value)


def test_export_onto_a_full_disk_is_refused_with_one_line(tiny_disk, export_main):
    result = export_main("resnet", "--arch", "resnet18", "--weights", "random", "--no-archive",
                         "--out", tiny_disk / "out")
    assert result.returncode == 1
    assert "not enough free disk space" in result.stderr and "--out" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tiny_disk / "out").exists() and not list(tiny_disk.glob(".out.partial-*"))
