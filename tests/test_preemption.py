"""dreamer/preemption.py: stop signals raise a flag; the previous handlers come back."""

from __future__ import annotations

import os
import signal

import pytest

from dreamer.run import preemption


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM])
def test_a_stop_signal_raises_the_flag_instead_of_killing_the_process(signum):
    before = signal.getsignal(signum)
    preemption.install()
    try:
        assert not preemption.requested()
        os.kill(os.getpid(), signum)
        assert preemption.requested() and preemption.requested_by() == signum
    finally:
        preemption.uninstall()
    assert signal.getsignal(signum) is before


def test_install_starts_with_no_request():
    preemption.request(signal.SIGTERM)
    preemption.install()
    try:
        assert not preemption.requested()
    finally:
        preemption.uninstall()


def test_installing_twice_still_restores_the_original_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    preemption.install()
    preemption.install()
    preemption.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is before
