"""Training metrics: one JSON line per step, mirrored to TensorBoard.

The JSONL file is the record the reports and ``spa compare`` read; TensorBoard is for
watching a run live (``tensorboard --logdir runs/``). On resume, lines after the resumed
step are dropped so a step is never logged twice.
"""

from __future__ import annotations

import json
from pathlib import Path

from spa.io import write_jsonl


class MetricsLogger:
    def __init__(self, out: str | Path, resume_step: int = 0, tensorboard: bool = True):
        self.path = Path(out) / "metrics.jsonl"
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        write_jsonl(self.path, kept)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **metrics}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics JSONL file (an unfinished last line is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records
