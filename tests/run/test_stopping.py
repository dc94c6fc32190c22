"""dreamer/run/stopping.py: stop signals record why; the deadline, the rank vote and the
requeue flag turn that into how the run ends; the previous handlers come back."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dreamer.run.result import FinishedBy
from dreamer.run.stopping import STOP_SIGNALS, Stopper, StopReason, StopRequested, under_requeueing_scheduler
from tests.support.gpu_checks import RANK_VOTE_NO_HOST_TRANSFER


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_raises_the_flag_instead_of_killing_the_process(signum, capsys):
    before = signal.getsignal(signum)
    stopper = Stopper().install()
    try:
        assert stopper.requested is None and stopper.poll() is None
        os.kill(os.getpid(), signum)
        assert stopper.requested == signal.Signals(signum).name
        assert stopper.poll() == "signal"
    finally:
        stopper.uninstall()
    assert signal.getsignal(signum) is before
    assert f"{signal.Signals(signum).name}: stopping after this step; writing a final checkpoint" in \
        capsys.readouterr().err


def test_install_starts_with_no_request():
    earlier = Stopper().install()
    earlier.request("SIGTERM")
    earlier.uninstall()
    stopper = Stopper().install()
    try:
        assert stopper.requested is None and stopper.poll() is None
    finally:
        stopper.uninstall()


def test_installing_twice_still_restores_the_original_handlers():
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stopper = Stopper()
    stopper.install()
    stopper.install()
    stopper.uninstall()
    stopper.uninstall()  # a second teardown changes nothing
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_the_first_signal_is_the_reason(capsys):
    stopper = Stopper().install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stopper.requested == "SIGTERM"
    finally:
        stopper.uninstall()
    assert capsys.readouterr().err.count("stopping after this step") == 1


@pytest.mark.parametrize("requeue, finished_by", [(False, "signal"), (True, "preempted")])
def test_a_signal_under_a_requeueing_scheduler_means_preempted(requeue, finished_by):
    stopper = Stopper(requeue=requeue)
    assert stopper.finished_by(stopper.poll()) == "total_frames"
    stopper.request("SIGUSR1")
    assert stopper.finished_by(stopper.poll()) == finished_by


def test_the_deadline_gives_max_minutes_and_a_signal_outranks_it():
    now = [100.0]
    stopper = Stopper(requeue=True, clock=lambda: now[0])
    stopper.limit_time(started=100.0, minutes=0.5)
    assert stopper.poll() is None
    now[0] = 129.9
    assert stopper.poll() is None
    now[0] = 130.0
    assert stopper.poll() == "max_minutes"
    # Not preempted: the budget is the user's.
    assert stopper.finished_by(StopReason.MAX_MINUTES) is FinishedBy.MAX_MINUTES
    stopper.request("SIGTERM")
    assert stopper.poll() == "signal"


def test_no_budget_never_expires():
    stopper = Stopper(clock=lambda: 1e12)
    stopper.limit_time(started=0.0, minutes=None)
    assert stopper.poll() is None


def test_the_ranks_vote_for_the_strongest_reason():
    votes = []

    def another_rank_has_a_signal(code: int) -> int:  # what max_over_ranks returns
        votes.append(code)
        return max(code, 2)

    stopper = Stopper()
    stopper.vote = another_rank_has_a_signal
    assert stopper.poll() == "signal" and votes == [0]  # this rank had no reason of its own
    assert stopper.requested is None and stopper.why == "rank signal"


def test_ranks_vote_every_few_updates_and_hold_a_local_reason_until_the_vote():
    """A vote is a blocking collective: not before every update. Between votes a
    local stop waits, so every rank leaves at the same update."""
    from dreamer.run.stopping import RANK_VOTE_EVERY

    votes = []
    stopper = Stopper()
    stopper.vote = lambda code: votes.append(code) or code
    assert [stopper.poll(before_update=u) for u in range(1, RANK_VOTE_EVERY)] == [None] * (RANK_VOTE_EVERY - 1)
    assert votes == []
    assert stopper.poll(before_update=RANK_VOTE_EVERY) is None and votes == [0]  # a vote: nobody stops
    stopper.request("SIGTERM")
    held = [stopper.poll(before_update=u) for u in range(RANK_VOTE_EVERY + 1, 2 * RANK_VOTE_EVERY)]
    assert held == [None] * (RANK_VOTE_EVERY - 1) and votes == [0]  # not voting updates: the stop waits
    assert stopper.poll(before_update=2 * RANK_VOTE_EVERY) == "signal" and votes == [0, 2]
    assert stopper.poll() == "signal"  # a batch boundary always votes
    alone = Stopper()  # one process: no vote, the local reason at once
    alone.request("SIGTERM")
    assert alone.poll(before_update=3) == "signal"


def _vote_on_rank(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from dreamer.system.distributed import cpu_group, max_over_ranks
    from tests.support.spies import HOST_TRANSFERS, CallCounter, spy_tensor_methods

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stopper = Stopper()
    stopper.vote = lambda code: max_over_ranks(code, group=cpu_group())
    if rank == 1:
        stopper.request("SIGUSR1")
    counter = CallCounter()
    with pytest.MonkeyPatch.context() as mp:
        spy_tensor_methods(mp, HOST_TRANSFERS, counter)
        held = [stopper.poll(before_update=u) for u in range(1, 10)]  # updates 1-9: no vote
    reasons = held + [stopper.poll(before_update=10)]
    out.put((rank, counter.total(), reasons))
    dist.destroy_process_group()


@pytest.mark.gpu_acceptance(RANK_VOTE_NO_HOST_TRANSFER)
def test_two_ranks_leave_together_with_no_host_transfer_between_votes():
    import torch.multiprocessing as mp

    from tests.system.test_distributed import free_port

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_vote_on_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [(0, 0, [None] * 9 + ["signal"]), (1, 0, [None] * 9 + ["signal"])]


def test_slurm_jobs_and_the_requeueing_launcher_are_requeueing_schedulers():
    assert not under_requeueing_scheduler({})
    assert under_requeueing_scheduler({"SLURM_JOB_ID": "4242"})
    assert under_requeueing_scheduler({"DREAMER_REQUEUE": "1"})


class _SignalledWhileFinalized:
    """Sends SIGTERM from its finalizer: the handler then runs inside a ``__del__``, as when the
    garbage collector finalizes something (a TorchRL env) just as a stop signal arrives."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_signal_landing_in_a_finalizer_still_interrupts_the_work(capsys):
    stopper = Stopper().install()
    alarm = signal.getsignal(signal.SIGVTALRM)
    try:
        with pytest.raises(StopRequested):
            with stopper.interruptible():
                _SignalledWhileFinalized()  # finalized at once: the signal lands in its __del__
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # long CPU-bound work with no poll point
                    pass
    finally:
        stopper.uninstall()
    assert stopper.requested == "SIGTERM" and signal.getsignal(signal.SIGVTALRM) is alarm
    assert "Traceback" not in capsys.readouterr().err
