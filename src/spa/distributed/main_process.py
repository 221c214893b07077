"""Work that the main process does alone while the others wait for its result
(:func:`on_main`), and work split over the processes whose results the main process
collects (:func:`from_each`).

Above :mod:`spa.distributed.fsdp`: under FSDP the model that the work reads is gathered
on every process first.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

from torch import nn

from spa.distributed import fsdp, process

T = TypeVar("T")


def on_main(fn: Callable[[], T], model: nn.Module | None = None) -> T:
    """``fn()`` run on the main process only (an evaluation that writes files), as a
    single-process run (:func:`spa.distributed.alone`), its result sent to the others,
    which wait for it.

    ``model``: a model that ``fn`` uses, as :func:`spa.distributed.wrap` returned it (or
    the module it wrapped). Under FSDP every process gathers its whole weights first
    (:func:`spa.distributed.gathered`): the main process cannot gather the others' shards alone.

    An exception in ``fn`` is raised on every process (the others get the same type and
    message), so that none of them waits out the timeout for a result that never comes.
    """
    if process.world()[1] == 1:
        return fn()
    result, error = None, None
    with fsdp.gathered(model):
        if process.is_main():
            try:
                with process.alone():
                    result = fn()
            except Exception as caught:  # noqa: BLE001 - sent on, then raised here as well
                error = caught
        result, sent = process.broadcast_value((result, None if error is None else _portable(error)))
    if error is not None:
        raise error
    if sent is not None:
        raise sent
    return result


def from_each(fn: Callable[[], T]) -> list[T] | None:
    """``fn()`` run on every process (each its share of some work: the levels of an
    evaluation), the results in rank order on the main process, None on the others.
    Alone: ``[fn()]``.

    An exception in ``fn`` on any process is raised on every process (the first in rank
    order where the process itself did not fail), so that none waits out the timeout in a
    collective that a failed process never joins: the processes first agree on whether
    all of them succeeded, a small exchange, and only then send the results.
    """
    if process.world()[1] == 1:
        return [fn()]
    result, error = None, None
    try:
        result = fn()
    except Exception as caught:  # noqa: BLE001 - sent on, then raised here as well
        error = caught
    errors = process.gather([None if error is None else _portable(error)])
    if error is not None:
        raise error
    sent = next((other for other in errors if other is not None), None)
    if sent is not None:
        raise sent
    return process.gather_on_main(result)


def _portable(error: Exception) -> Exception:
    """``error`` if it survives pickling (to go to the other processes), else a RuntimeError
    with its type and message."""
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to pickle means: send the text
        return RuntimeError(f"{type(error).__name__}: {error}")
