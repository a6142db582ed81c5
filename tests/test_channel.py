"""The FIFO channel (and its spool fallback), with real FIFOs and processes, read by a run's thread."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from helpers import wait_drained, wait_until
from jupyter_traincontrol.run.run_thread import RunThread
from jupyter_traincontrol.transport.fifo import FIFO_NAME
from jupyter_traincontrol.transport.channels import NotListeningError, deliver, open_channel
from jupyter_traincontrol.protocol import Command
from jupyter_traincontrol.system.private_fs import UnsafePathError


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    return path


def reading(folder, kind, name, ticker=None, health_check_seconds=0.5, start=True, **kwargs):
    """A run's thread reading a new channel of `kind` in `folder` (started unless `start` is False)."""
    thread = RunThread(open_channel(folder, kind, **kwargs), ticker, name=name,
                       health_check_seconds=health_check_seconds)
    return thread.start() if start else thread


@pytest.fixture(params=["fifo", "spool"])
def channel(request, folder):
    rejected = []
    notices = []
    thread = reading(folder, request.param, "test", on_rejected=rejected.append, on_notice=notices.append,
                     health_check_seconds=0.05)
    ch = thread.channel
    ch.rejected, ch.notices = rejected, notices
    yield ch
    thread.close()


def drain(channel, count, timeout=10):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        request = channel.get(0.05)
        if request is not None:
            got.append(request.command)
    return got


def test_fifo_is_private(folder):
    ch = open_channel(folder, "fifo")
    try:
        mode = os.lstat(folder / FIFO_NAME).st_mode
        assert stat.S_ISFIFO(mode)
        assert stat.S_IMODE(mode) == 0o600
    finally:
        ch.close()


def test_commands_arrive_in_order(channel):
    for word in ["save", "pause", "resume", "stop"]:
        deliver(channel.address, word)
    assert drain(channel, 4) == [Command.SAVE, Command.PAUSE, Command.RESUME, Command.STOP]


def test_pending_is_a_flag_and_get_wakes_at_once(channel):
    assert not channel.pending
    assert channel.pop() is None
    threading.Timer(0.1, deliver, (channel.address, "stop")).start()
    started = time.monotonic()
    assert channel.get(5).command is Command.STOP
    assert time.monotonic() - started < 2
    assert not channel.pending
    assert not channel.pending


def test_shell_echo_works(channel):
    if channel.kind != "fifo":
        pytest.skip("echo > FIFO is for FIFOs")
    subprocess.run(["sh", "-c", f"echo stop > '{channel.address}'"], check=True, timeout=10)
    assert drain(channel, 1) == [Command.STOP]


def test_garbage_is_reported_and_later_commands_still_work(channel):
    if channel.kind == "fifo":
        fd = os.open(channel.address, os.O_WRONLY)
        for chunk in [os.urandom(4096).replace(b"\n", b"x") + b"\n", b"\xff\xfe\n", b"x" * (1 << 20) + b"\n", b"hello\n", b"sa", b"ve\n"]:
            os.write(fd, chunk)
            time.sleep(0.01)
        os.close(fd)
    else:
        staged = channel.folder / "inbox" / "1.tmp"  # whole before the reader sees it, as writers do (a rename)
        staged.write_bytes(b"hello\n\xff\n")
        staged.rename(staged.with_suffix(".cmd"))
        deliver(channel.address, "save")
    assert drain(channel, 1) == [Command.SAVE]
    wait_until(lambda: len(channel.rejected) >= 2, message="rejections reported")
    assert any("hello" in r.text for r in channel.rejected)


def test_fifty_concurrent_writers_lose_nothing_and_duplicate_nothing(channel):
    writers, per_writer = 50, 100
    if channel.kind == "spool":
        writers, per_writer = 10, 20  # one file per command: keep it short
    words = ["save", "pause", "resume"]
    barrier = threading.Barrier(writers)

    def write_many(index):
        barrier.wait()
        for i in range(per_writer):
            deliver(channel.address, words[(index + i) % 3])

    threads = [threading.Thread(target=write_many, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    got = drain(channel, writers * per_writer, timeout=60)
    for thread in threads:
        thread.join()
    assert len(got) + len(drain(channel, 1, timeout=0.2)) == writers * per_writer
    assert not channel.rejected


def test_writer_processes_killed_mid_line_do_not_break_the_channel(channel):
    if channel.kind != "fifo":
        pytest.skip("mid-line writes are a FIFO matter")
    code = "import os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(fd, b'sto'); print('written', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code, channel.address], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "written"
    finally:
        child.kill()
        child.communicate()
    wait_drained(channel.address)  # in one read with the next line, the remnant would be that line's start
    deliver(channel.address, "save")
    assert drain(channel, 1) == [Command.SAVE]


def test_send_without_reader_fails_at_once_and_never_hangs(folder):
    os.mkfifo(folder / "orphan", 0o600)
    started = time.monotonic()
    with pytest.raises(NotListeningError, match="not listening"):
        deliver(folder / "orphan", "stop")
    assert time.monotonic() - started < 1
    with pytest.raises(NotListeningError):
        deliver(folder / "missing", "stop")


def test_send_refuses_a_symlink(channel, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(channel.address)
    with pytest.raises(UnsafePathError, match="symlink"):
        deliver(link, "stop")
    assert not channel.pending


def test_send_refuses_a_fifo_others_can_write(folder):
    os.mkfifo(folder / "public", 0o600)
    os.chmod(folder / "public", 0o622)
    reader = os.open(folder / "public", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(UnsafePathError, match="lets others in"):
            deliver(folder / "public", "stop")
    finally:
        os.close(reader)


def test_channel_refuses_a_preplanted_path(folder):
    (folder / FIFO_NAME).symlink_to("/tmp")
    with pytest.raises(FileExistsError):
        open_channel(folder, "fifo")


def test_fifo_deleted_under_a_live_channel_is_recreated(channel):
    if channel.kind != "fifo":
        os.rmdir(channel.address)
    else:
        os.unlink(channel.address)
    wait_until(lambda: channel.notices, message="a notice about the deleted channel")
    assert "re-created" in channel.notices[0]
    deliver(channel.address, "stop")
    assert drain(channel, 1) == [Command.STOP]


def test_fifo_replaced_by_a_file_is_recreated(channel):
    if channel.kind != "fifo":
        pytest.skip("FIFO only")
    os.unlink(channel.address)
    with open(channel.address, "w") as handle:
        handle.write("stop\n")
    wait_until(lambda: channel.notices, message="a notice about the replaced FIFO")
    assert stat.S_ISFIFO(os.lstat(channel.address).st_mode)
    deliver(channel.address, "save")
    assert drain(channel, 1) == [Command.SAVE]


def test_close_removes_the_channel_and_stops_the_thread(folder):
    thread = reading(folder, "fifo", "closing")
    address = thread.channel.address
    thread.close()
    thread.close()  # idempotent
    assert not os.path.exists(address)
    assert not [t for t in threading.enumerate() if t.name == "traincontrol-reader-closing"]
    with pytest.raises(NotListeningError):
        deliver(address, "stop")


@pytest.mark.parametrize("kind", ["fifo", "spool"])
def test_stop_lets_the_reader_end_without_waiting_for_it_and_close_joins_it_and_removes_the_channel(folder, kind):
    """A run's end writes its last record while its thread ends (`stop`), then joins it (`close`)."""
    thread = reading(folder, kind, "stopping")
    address = thread.channel.address
    thread.stop()
    thread.stop()  # idempotent
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "traincontrol-reader-stopping"], timeout=5,
               message="the run's thread to end by itself")
    assert os.path.exists(address)  # the channel stays until `close`
    thread.close()
    thread.close()  # idempotent
    assert not os.path.exists(address)
    with pytest.raises(NotListeningError):
        deliver(address, "stop", kind=kind)


@pytest.mark.parametrize("kind", ["fifo", "spool"])
def test_end_removes_the_channel_at_once_and_the_thread_closes_the_rest_as_it_ends(folder, kind):
    """A run's end: nobody waits for its thread, whose name is free at once."""
    thread = reading(folder, kind, "ending", health_check_seconds=0.01)
    ch = thread.channel
    address = ch.address
    time.sleep(0.05)  # a few health checks: none re-makes the channel once `end` removed it
    lasts = []
    thread.end(last=lambda: lasts.append(threading.current_thread().name))
    assert not os.path.exists(address)
    with pytest.raises(NotListeningError):
        deliver(address, "stop", kind=kind)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "traincontrol-reader-ending"], timeout=5,
               message="the run's thread to end by itself")
    assert lasts == ["traincontrol-reader-ending"]
    if kind == "fifo":
        assert ch._wake_w == ch._wake_r == ch._read_fd == -1, "the thread closed its descriptors"
    time.sleep(0.05)
    assert not os.path.exists(address)
    thread.end()
    thread.close()  # idempotent: nothing left to do
    assert lasts == ["traincontrol-reader-ending"]


def test_end_of_a_channel_whose_thread_never_started_does_everything_at_once(folder):
    thread = reading(folder, "fifo", "unstarted", start=False)
    ch = thread.channel
    lasts = []
    thread.end(last=lambda: lasts.append("last"))
    assert lasts == ["last"] and not os.path.exists(folder / FIFO_NAME)
    assert ch._wake_w == ch._read_fd == -1


def test_unknown_channel_kind_is_a_clear_error(folder):
    with pytest.raises(ValueError, match="Expected one of: fifo, spool"):
        open_channel(folder, "carrier-pigeon")


class CountingTicker:
    """A ticker that counts its ticks; due when `due` says (infinite: never)."""

    def __init__(self):
        self.due = float("inf")
        self.ticks = 0

    def due_in(self):
        return self.due

    def tick(self):
        self.ticks += 1


@pytest.mark.parametrize("kind", ["fifo", "spool"])
def test_the_runs_thread_drives_a_ticker_when_due_and_when_woken(folder, kind):
    ticker = CountingTicker()
    thread = reading(folder, kind, "ticking", ticker, health_check_seconds=30)
    ch = thread.channel
    try:
        time.sleep(0.3)
        assert ticker.ticks == 0, "the thread ticked with nothing due"
        ch.wake()
        wait_until(lambda: ticker.ticks >= 1, message="a tick after wake()")
        woken = ticker.ticks
        time.sleep(0.3)
        assert ticker.ticks == woken, f"one wake-up ticked {ticker.ticks - woken} more times (a wake-up left behind)"
        ticker.due = 0.02
        ch.wake()
        wait_until(lambda: ticker.ticks >= woken + 5, message="ticks every 20 ms once due")
        deliver(ch.address, "save")  # commands still arrive while it ticks
        assert drain(ch, 1) == [Command.SAVE]
    finally:
        thread.close()
    ch.wake()  # closed: nothing to wake, no error
    assert not [t for t in threading.enumerate() if t.name == "traincontrol-reader-ticking"]
