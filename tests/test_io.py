"""Atomic checkpoint folders: all or nothing, and a full disk said plainly."""

import errno
from collections import namedtuple

import pytest

from spa import io

Usage = namedtuple("Usage", "total used free")


def test_atomic_dir_replaces_whole_or_leaves_the_old_one(tmp_path):
    target = tmp_path / "ckpt"
    with io.atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(KeyError):
        with io.atomic_dir(target) as tmp:
            (tmp / "a").write_text("2")
            raise KeyError("interrupted")
    assert (target / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left


def test_a_write_that_fills_the_disk_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(io.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 2**20))
    with pytest.raises(RuntimeError, match=r"ckpt: the disk is full \(1 MiB free\)") as info:
        with io.atomic_dir(tmp_path / "ckpt"):
            raise RuntimeError(" . unexpected pos 240715584 vs 240715476")  # torch.save's words
    assert "unexpected pos" in str(info.value.__cause__)
    assert list(tmp_path.iterdir()) == []


def test_enospc_is_a_full_disk_whatever_the_free_space_reads(tmp_path):
    with pytest.raises(RuntimeError, match="the disk is full"):
        with io.atomic_dir(tmp_path / "ckpt"):
            raise OSError(errno.ENOSPC, "No space left on device")


def test_other_write_errors_pass_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(io.shutil, "disk_usage", lambda p: Usage(10**12, 0, 10**12))
    with pytest.raises(RuntimeError, match="^something else$"):
        with io.atomic_dir(tmp_path / "ckpt"):
            raise RuntimeError("something else")
