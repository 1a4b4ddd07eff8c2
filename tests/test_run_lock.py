"""The run lock is exclusive: one holder at a time, stale locks taken over exactly once,
live ones respected, and a release that removes only its own lock."""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ember.errors import TrainingError
from ember.train.files.lock import LockOwner, RunLock, _process_stat

pytestmark = pytest.mark.skipif(os.name == "nt", reason="pids are not probed on Windows")
LINUX = Path("/proc/self/stat").exists()
linux_only = pytest.mark.skipif(not LINUX, reason="start times and boot ids come from /proc")


def context():
    """Fork where there is one: the children start at once, with ember already imported."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


@pytest.fixture(scope="module")
def dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def sleeper():
    """A live process on this host that holds no lock."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def write_lock(path: Path, owner: LockOwner) -> None:
    path.write_text(owner.dumps())


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != ".lock")


# Two processes looping the lock -----------------------------------------------------------
def _loop(path: str, out: str, seconds: float, start) -> None:
    lock_path = Path(path)
    me = os.getpid()
    start.wait(30)
    intervals, busy, takeovers, foreign = [], 0, 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lock = RunLock(lock_path)
        try:
            lock.acquire()
        except TrainingError:
            busy += 1
            continue
        begin = time.monotonic_ns()
        if lock.takeover_message is not None:
            takeovers += 1
        try:
            owner = LockOwner.parse(lock_path.read_text())
        except FileNotFoundError:
            owner = None
        if owner is None or owner.pid != me:
            foreign += 1
        end = time.monotonic_ns()
        lock.release()
        intervals.append((begin, end))
    lines = [f"{begin} {end}" for begin, end in intervals]
    Path(out).write_text(f"{busy} {takeovers} {foreign}\n" + "\n".join(lines) + "\n")


def test_two_processes_looping_the_lock_never_hold_it_together(tmp_path):
    ctx = context()
    start = ctx.Event()
    lock_path = tmp_path / ".lock"
    outs = [tmp_path / f"holder{i}.txt" for i in range(2)]
    workers = [
        ctx.Process(target=_loop, args=(str(lock_path), str(out), 3.0, start)) for out in outs
    ]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    held = []
    for index, out in enumerate(outs):
        head, *lines = out.read_text().splitlines()
        busy, takeovers, foreign = map(int, head.split())
        intervals = [tuple(map(int, line.split())) for line in lines]
        assert takeovers == 0, "a live holder's lock was taken over"
        assert foreign == 0, "a holder found another's lock at the path"
        assert len(intervals) >= 20 and busy > 0, (len(intervals), busy)
        held += [(begin, end, index) for begin, end in intervals]
    held.sort()
    overlaps = 0
    last_end, last_holder = 0, None
    for begin, end, holder in held:
        if begin <= last_end and holder != last_holder:
            overlaps += 1
        if end > last_end:
            last_end, last_holder = end, holder
    assert overlaps == 0
    assert not lock_path.exists()
    assert leftovers(tmp_path) == ["holder0.txt", "holder1.txt"]


# Two processes taking over one stale lock at once ---------------------------------------
def _race(path: str, out: str, rounds: int, barrier) -> None:
    results = []
    for _ in range(rounds):
        barrier.wait(30)  # a stale lock is in place
        lock = RunLock(Path(path))
        try:
            lock.acquire()
            won = True
        except TrainingError:
            won = False
        took = lock.takeover_message is not None
        barrier.wait(30)  # both have tried
        lock.release()
        results.append(f"{int(won)} {int(took)}")
        barrier.wait(30)  # the winner has released
    Path(out).write_text("\n".join(results) + "\n")


def test_two_processes_taking_over_one_stale_lock_at_once_one_wins(tmp_path, dead_pid):
    ctx = context()
    rounds = 30
    barrier = ctx.Barrier(3)
    lock_path = tmp_path / ".lock"
    outs = [tmp_path / f"racer{i}.txt" for i in range(2)]
    workers = [
        ctx.Process(target=_race, args=(str(lock_path), str(out), rounds, barrier)) for out in outs
    ]
    for worker in workers:
        worker.start()
    stale = LockOwner(socket.gethostname(), dead_pid, token="stale")
    for _ in range(rounds):
        write_lock(lock_path, stale)
        for _ in range(3):
            barrier.wait(30)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    per_worker = [
        [tuple(map(int, line.split())) for line in out.read_text().splitlines()] for out in outs
    ]
    for first, second in zip(*per_worker):
        assert first[0] + second[0] == 1, "exactly one process holds the lock"
        assert first[1] + second[1] == 1, "the stale lock is taken over exactly once"
    assert not lock_path.exists()
    assert leftovers(tmp_path) == ["racer0.txt", "racer1.txt"]


# Stale locks ------------------------------------------------------------------------------
def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, dead_pid, caplog):
    path = tmp_path / ".lock"
    write_lock(path, LockOwner(socket.gethostname(), dead_pid, started=1, boot=None))
    lock = RunLock(path)
    with caplog.at_level(logging.WARNING, logger="ember.train.files.lock"):
        lock.acquire()
    assert lock.owned
    message = lock.takeover_message
    assert message is not None
    assert f"left by process {dead_pid} on {socket.gethostname()}" in message
    assert f"no process {dead_pid} runs any more" in message
    assert message in caplog.text
    owner = LockOwner.parse(path.read_text())
    assert owner is not None and owner.pid == os.getpid()
    lock.release()
    assert not path.exists() and leftovers(tmp_path) == []


def test_a_lock_in_the_old_pid_host_format_is_still_understood(tmp_path, dead_pid, sleeper):
    path = tmp_path / ".lock"
    path.write_text(f"{sleeper.pid} {socket.gethostname()}\n")
    with pytest.raises(TrainingError, match=rf"in use by process {sleeper.pid} on "):
        RunLock(path).acquire()
    path.write_text(f"{dead_pid} {socket.gethostname()}\n")
    lock = RunLock(path)
    lock.acquire()
    assert lock.takeover_message is not None and str(dead_pid) in lock.takeover_message
    lock.release()


@linux_only
def test_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path, sleeper):
    path = tmp_path / ".lock"
    stat = _process_stat(sleeper.pid)
    assert stat is not None
    reused = LockOwner(socket.gethostname(), sleeper.pid, started=stat[1] - 1, boot=None)
    write_lock(path, reused)
    lock = RunLock(path)
    lock.acquire()
    assert lock.takeover_message is not None
    assert f"process {sleeper.pid} is now another process" in lock.takeover_message
    assert "pid was reused" in lock.takeover_message
    lock.release()


@linux_only
def test_a_lock_from_before_the_machine_restarted_is_taken_over(tmp_path):
    path = tmp_path / ".lock"
    mine = LockOwner.current()  # a live pid with the right start time, but another boot
    write_lock(path, LockOwner(mine.host, mine.pid, mine.started, boot="another-boot"))
    lock = RunLock(path)
    lock.acquire()
    assert lock.takeover_message is not None
    assert "restarted" in lock.takeover_message and "boot id" in lock.takeover_message
    lock.release()


def test_a_lock_of_an_ended_but_unreaped_process_is_taken_over(tmp_path):
    if not LINUX:
        pytest.skip("process states come from /proc")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while (_process_stat(child.pid) or ("?",))[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        stat = _process_stat(child.pid)
        assert stat is not None and stat[0] == "Z"
        path = tmp_path / ".lock"
        write_lock(path, LockOwner(socket.gethostname(), child.pid, started=stat[1]))
        lock = RunLock(path)
        lock.acquire()
        assert lock.takeover_message is not None
        assert f"process {child.pid} has ended" in lock.takeover_message
        lock.release()
    finally:
        child.wait()


def test_an_unreadable_lock_is_respected_while_young_and_taken_over_when_old(tmp_path):
    path = tmp_path / ".lock"
    path.write_text("")
    with pytest.raises(TrainingError, match="holds no process record"):
        RunLock(path).acquire()
    old = time.time() - 60
    os.utime(path, (old, old))
    lock = RunLock(path)
    lock.acquire()
    assert lock.takeover_message is not None
    assert "holds no process record" in lock.takeover_message
    lock.release()
    assert not path.exists()


# Live locks -------------------------------------------------------------------------------
def _hold(path: str, ready, stop) -> None:
    lock = RunLock(Path(path))
    lock.acquire()
    ready.set()
    stop.wait(60)
    lock.release()


def test_a_lock_of_a_live_process_on_this_host_is_respected(tmp_path):
    ctx = context()
    ready, stop = ctx.Event(), ctx.Event()
    path = tmp_path / ".lock"
    holder = ctx.Process(target=_hold, args=(str(path), ready, stop))
    holder.start()
    try:
        assert ready.wait(30)
        before = path.read_text()
        lock = RunLock(path)
        with pytest.raises(TrainingError) as caught:
            lock.acquire()
        message = str(caught.value)
        host = socket.gethostname()
        assert f"{tmp_path} is in use by process {holder.pid} on {host}" in message
        assert f"lock file {path}" in message
        assert f"delete {path} by hand" in message and "safe only once" in message
        assert not lock.owned and lock.takeover_message is None
        assert path.read_text() == before
        lock.release()  # never acquired: removes nothing
        assert path.read_text() == before
    finally:
        stop.set()
        holder.join(30)
    assert holder.exitcode == 0
    assert not path.exists()


def test_a_second_lock_in_the_same_process_is_refused(tmp_path):
    path = tmp_path / ".lock"
    first = RunLock(path)
    first.acquire()
    with pytest.raises(TrainingError, match=rf"in use by process {os.getpid()} on "):
        RunLock(path).acquire()
    first.release()
    assert not path.exists()


def test_a_lock_from_another_host_is_respected(tmp_path, dead_pid):
    path = tmp_path / ".lock"
    write_lock(path, LockOwner("elsewhere.example", dead_pid, boot="another-boot"))
    with pytest.raises(TrainingError, match=r"in use by process \d+ on elsewhere\.example"):
        RunLock(path).acquire()
    assert path.exists()


# Release ----------------------------------------------------------------------------------
def test_release_never_deletes_another_processs_lock(tmp_path, sleeper, caplog):
    path = tmp_path / ".lock"
    lock = RunLock(path)
    lock.acquire()
    # the lock was removed by hand and another run took the directory
    path.unlink()
    other = LockOwner(socket.gethostname(), sleeper.pid, token="other").dumps()
    path.write_text(other)
    with caplog.at_level(logging.WARNING, logger="ember.train.files.lock"):
        lock.release()
    assert path.read_text() == other
    assert f"now belongs to process {sleeper.pid}" in caplog.text
    assert not lock.owned


def _release_copy(lock: RunLock) -> None:
    lock.release()


def test_a_forked_copy_of_the_holder_never_releases_its_lock(tmp_path):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork here")
    path = tmp_path / ".lock"
    lock = RunLock(path)
    lock.acquire()
    before = path.read_text()
    child = multiprocessing.get_context("fork").Process(target=_release_copy, args=(lock,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert path.read_text() == before
    lock.release()
    assert not path.exists()
