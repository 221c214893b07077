import pytest
import torch

from spa import heap


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(heap._libc() is None, reason="glibc only")
def test_release_returns_freed_heap_memory_that_glibc_kept(monkeypatch):
    monkeypatch.delenv("SPA_MALLOC_TUNING", raising=False)
    assert heap.tune_malloc()  # 1 MiB blocks now come from the heap and stay there when freed
    blocks = [torch.ones(2**18) for _ in range(400)]  # 400 MiB, touched
    kept = blocks[::8] + [blocks[-1]]  # every 8th block and the last pin the heap: no top to trim
    del blocks
    before = resident_bytes()
    heap.release()
    assert before - resident_bytes() > 200 * 2**20  # most of the ~350 MiB freed comes back
    assert sum(block.numel() for block in kept) == 51 * 2**18  # still there, still readable


def test_releasing_releases_also_when_the_stage_raises(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "release", lambda: calls.append("release"))

    @heap.releasing
    def stage(fail: bool) -> str:
        calls.append("stage")
        if fail:
            raise RuntimeError("stage failed")
        return "done"

    assert stage(False) == "done" and calls == ["stage", "release"]
    with pytest.raises(RuntimeError, match="stage failed"):
        stage(True)
    assert calls == ["stage", "release"] * 2 and stage.__name__ == "stage"
