"""Stage wall times summed over the processes that ran a stage."""

import json
import time

import pytest

from spa.pipeline.clock import StageClock


def test_an_interrupted_stage_leaves_its_time_and_the_next_process_counts_on(tmp_path):
    path = tmp_path / "clock.json"
    path.write_text(json.dumps({"sft": 12.5}))  # another stage's, unfinished
    with pytest.raises(KeyboardInterrupt), StageClock(path, "rl"):
        raise KeyboardInterrupt
    left = json.loads(path.read_text())
    assert left["sft"] == 12.5 and left["rl"] >= 0
    path.write_text(json.dumps({**left, "rl": 100.0}))  # as if the first process had run 100 s
    with StageClock(path, "rl") as clock:
        assert clock.before == 100.0
    assert 100.0 <= clock.seconds() < 160.0
    assert clock.seconds() == clock.seconds()  # stopped at the end of the block
    assert json.loads(path.read_text()) == {"sft": 12.5}  # the finished stage's entry is gone


def test_the_count_reaches_disk_while_the_stage_runs(tmp_path):
    # A process killed without warning runs no exit code: only the heartbeat's writes remain.
    path = tmp_path / "clock.json"
    with StageClock(path, "eval_final", every=0.01):
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert json.loads(path.read_text())["eval_final"] >= 0
    assert not path.exists()
