"""Many paired comparisons at once, as one Markdown table (``spa paired`` for each line).

Each line of the list names two evaluations that played the same levels, the later one
first, ``AFTER BEFORE``; a side is ``RUN:ROUND`` (round ``ROUND`` of an expert-iteration
run, found by name under the ``--runs`` folders in order, so that a run reads the same
whether it is still running in ``runs/`` or archived in ``results/runs``; name ``runs``
first, as a run in flight may also have an older archive), ``random``
(the ``--random`` evaluation, e.g. ``spa eval --policy random``) or an evaluation folder.
Blank lines and ``#`` comments are skipped. Every row is Pass@1 after minus before, in
points, with its 95% interval over levels, the levels that rose and fell, and the same
for Pass@k with k the samples of a level:

    python experiments/paired_table.py experiments/sokoban-pairs.txt \\
        --runs runs --runs results/runs --random /tmp/sok-random --strip sokoban- --strip=-iterate

A line whose evaluations are not there yet is listed under the table, not dropped silently.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spa.eval.paired import compare_evaluations, signed_pct_with_interval


def resolve(side: str, runs: list[Path], random: Path | None, strip: tuple[str, ...] = ()) -> tuple[Path, str]:
    """``(evaluation folder, label)`` of one side of a line; ``strip``: text left out of a
    run's name in its label."""
    if side == "random":
        if random is None:
            raise ValueError("'random' needs --random, the folder of a random-policy evaluation")
        return random, "random valid actions"
    name, colon, round_ = side.rpartition(":")
    if colon and round_.isdigit():
        fallback = runs[0] / name if runs else Path(name)
        base = next((folder / name for folder in runs if (folder / name).is_dir()), fallback)
        short = name
        for text in strip:
            short = short.replace(text, "")
        return base / "rl" / f"round-{round_}" / "eval", f"{short} {'start' if round_ == '0' else f'round {round_}'}"
    return Path(side), side


def rows(lines: list[str], runs: list[Path], random: Path | None,
         strip: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The table's rows and the lines left out (with why), in the order of ``lines``."""
    table, missing = [], []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        sides = line.split()
        if len(sides) != 2:
            raise ValueError(f"a line names two evaluations, AFTER BEFORE; got {line!r}")
        (after, after_label), (before, before_label) = (resolve(side, runs, random, strip) for side in sides)
        try:
            result = compare_evaluations(before, after)
        except (FileNotFoundError, ValueError) as error:
            missing.append(f"{line}: {error}")
            continue
        k = max(int(key.removeprefix("pass@")) for key in result if key.startswith("pass@"))
        cells = [f"{after_label} - {before_label}", *_difference(result["pass@1"]),
                 *(_difference(result[f"pass@{k}"]) if k > 1 else ("-", "-"))]  # one sample a level: no Pass@k
        table.append("| " + " | ".join(cells) + " |")
    return table, missing


def _difference(paired: dict) -> tuple[str, str]:
    """The difference with its interval, and the levels up / down, of one Pass@k."""
    return (signed_pct_with_interval(paired["difference"], paired["difference_ci95"]),
            f"{paired['improved']} / {paired['worsened']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", type=Path, help="the list of comparisons, one 'AFTER BEFORE' a line")
    parser.add_argument("--runs", type=Path, action="append", default=[],
                        help="a folder of runs, searched in order for RUN of RUN:ROUND (repeatable)")
    parser.add_argument("--random", type=Path, help="the evaluation folder that 'random' names")
    parser.add_argument("--strip", action="append", default=[],
                        help="text to leave out of run names in the labels, e.g. --strip=-iterate (repeatable)")
    args = parser.parse_args(argv)
    try:
        table, missing = rows(args.pairs.read_text().splitlines(), args.runs or [Path("runs")], args.random,
                              tuple(args.strip))
    except ValueError as error:
        parser.error(str(error))
    print("| after - before | Pass@1 difference | levels up / down | Pass@k difference | levels up / down |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(table))
    if missing:
        print("\nNot compared (evaluations not there yet, or other levels):", *missing, sep="\n- ")
    print("\nPoints; 95% intervals over levels (normal approximation); Pass@k: k = the samples of a level.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
