"""Stops asked for by a signal, honoured where no training is lost.

A training loop writes a resume point only now and then (SFT every 10 minutes, PPO every
``save_every`` steps), so Ctrl-C or a ``kill`` between two of them threw the work since
the last one away. Inside :func:`graceful` the loop is told instead:

- SIGINT (Ctrl-C) or SIGTERM: the loop finishes its optimizer step, writes its resume
  point and raises :class:`Interrupted`; the same command then continues from there. A
  second SIGINT or SIGTERM interrupts at once, for a user who will not wait for the step.
- SIGUSR1: the loop writes a resume point after its step and goes on, for a machine about
  to be taken away (``kill -USR1 PID`` a minute before). Outside a training loop the
  command line ignores it (:func:`ignore_save_requests`), so a request sent while a run
  plays or evaluates, which resume from their last turn anyway, does not end it.

Handlers can only be set from the main thread; elsewhere :func:`graceful` leaves the
signals as they are and no request ever arrives.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from spa import distributed


class Interrupted(KeyboardInterrupt):
    """A training loop stopped by a signal after writing its resume point."""


def stopped(saved: str) -> Interrupted:
    """The exception to raise once the resume point is written, its message (``saved``
    says what was kept) shown on stderr by the main process first: the command line
    reports a KeyboardInterrupt as a bare "Aborted!"."""
    message = f"Stopped by a signal; {saved}. Run the same command again to continue."
    if distributed.is_main():
        print(message, file=sys.stderr, flush=True)
    return Interrupted(message)


@dataclass
class Requests:
    """What the signals received so far ask of the loop."""

    stop: bool = False
    save: bool = False

    def take(self) -> tuple[bool, bool]:
        """``(stop, save)`` asked of any process, agreed by all (every process must save and
        stop at the same step); the save request is consumed."""
        stop, save = distributed.total(float(self.stop), float(self.save))
        self.save = False
        return stop > 0, save > 0


def ignore_save_requests() -> None:
    """Ignore SIGUSR1 from now on except inside :func:`graceful` (by default it ends the
    process)."""
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


@contextmanager
def graceful() -> Iterator[Requests]:
    """Route SIGINT, SIGTERM and SIGUSR1 to a :class:`Requests` for the duration (module
    docstring); the previous handlers come back afterwards."""
    requests = Requests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return

    def stop(signum, frame):
        if requests.stop:  # asked twice: the user will not wait for the step to end
            raise KeyboardInterrupt
        requests.stop = True

    def save(signum, frame):
        requests.save = True

    handlers = {signal.SIGINT: stop, signal.SIGTERM: stop}
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        handlers[signal.SIGUSR1] = save
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield requests
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Asked for after the loop's last step (here or in another process: every process leaves
    # the loop here, so all can agree): its work is saved, stop now.
    if requests.take()[0]:
        raise stopped("the stage had finished and is saved")
