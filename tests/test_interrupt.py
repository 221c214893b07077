import os
import signal
import threading

import pytest

from spa.interrupt import Interrupted, graceful

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def handlers():
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


def test_signals_become_requests_and_the_old_handlers_come_back():
    before = handlers()
    with pytest.raises(Interrupted, match="Run the same command again"):
        with graceful() as requests:
            assert requests.take() == (False, False)
            os.kill(os.getpid(), signal.SIGUSR1)
            assert requests.take() == (False, True)
            assert requests.take() == (False, False)  # a save request is taken once
            os.kill(os.getpid(), signal.SIGTERM)
            assert requests.take() == (True, False)
            assert requests.take() == (True, False)  # a stop stays asked for
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)  # asked twice: at once
        # Leaving with the stop still asked for (the loop ended first) stops too.
    assert handlers() == before


def test_a_block_without_a_signal_leaves_quietly():
    before = handlers()
    with graceful() as requests:
        assert requests.take() == (False, False)
    assert handlers() == before


def test_a_stop_asked_of_another_process_after_the_last_step_stops_this_one(monkeypatch):
    from spa import distributed

    # Another process got the signal after the loop's last step: the sum says so.
    monkeypatch.setattr(distributed, "total", lambda stop, save: (stop + 1.0, save))
    with pytest.raises(Interrupted, match="had finished and is saved"):
        with graceful():
            pass


def test_outside_the_main_thread_the_signals_are_left_alone():
    seen = []

    def body():
        with graceful() as requests:
            seen.append((handlers(), requests.take()))

    before = handlers()
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [(before, (False, False))]


def test_the_command_line_ignores_a_save_request_outside_training():
    from typer.testing import CliRunner

    from spa.cli import app

    before = signal.getsignal(signal.SIGUSR1)
    try:
        result = CliRunner().invoke(app, ["envs"])
        assert result.exit_code == 0, result.output
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the test process by default
    finally:
        signal.signal(signal.SIGUSR1, before)
