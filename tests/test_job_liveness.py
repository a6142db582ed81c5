"""A job's verdict on its peers (`job_liveness.Peers`) and its SIGTERM relay
(`job_signals.SigtermRelay`), in this process: the multi-process runs are in
test_distributed.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from jupyter_traincontrol.job.liveness import Peers, this_process
from jupyter_traincontrol.job.signals import SigtermRelay


def _beat(n: int, state: str = "running", **fields) -> dict:
    return {"beat": n, "state": state, **this_process(), **fields}


def test_a_peer_whose_heartbeat_stops_is_lost_after_lost_after():
    peers = Peers(0, 3, lost_after=5, startup=60)
    peers.update({1: _beat(1), 2: _beat(1)}, now=100.0)
    peers.update({1: _beat(2), 2: _beat(1)}, now=104.0)  # process 2's beat did not change
    assert peers.verdict(104.9) is None
    assert peers.verdict(105.0) == (2, "no heartbeat for 5 s")
    assert [row["state"] for row in peers.table(lost=2, own_state="failed")] == ["failed", "running", "lost"]


def test_a_peer_that_never_beat_is_lost_only_after_the_startup_allowance():
    peers = Peers(0, 2, lost_after=5, startup=60)
    start = peers.started
    assert peers.verdict(start + 59) is None
    assert peers.verdict(start + 60) == (1, "no heartbeat at all in 60 s")


def test_a_peer_on_this_host_whose_process_is_gone_is_lost_at_once():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        peers = Peers(0, 3, lost_after=5, startup=60)
        peers.update({1: {**_beat(1), "pid": zombie.pid}, 2: {**_beat(1), "pid": gone.pid}}, now=0.0)
        assert peers.verdict(0.0) == (1, f"its process (pid {zombie.pid}) is gone")
        # Ended well: not lost, whatever its pid.
        peers.update({1: {**_beat(2, "stopped"), "pid": zombie.pid}}, now=0.0)
        assert peers.verdict(0.0) == (2, f"its process (pid {gone.pid}) is gone")
        # Another host's pid says nothing here (nor does a live one).
        peers.update({2: {**_beat(2), "pid": gone.pid, "host": "elsewhere"}}, now=0.0)
        assert peers.verdict(0.0, store_answers=False) is None
    finally:
        zombie.wait()


def test_a_peer_that_failed_takes_the_job_down_naming_whom_it_found_lost():
    peers = Peers(0, 3, lost_after=5, startup=60)
    peers.update({1: _beat(1, "failed", error="Process 2 of 3 was lost: no heartbeat for 5 s.", lost_process=2),
                  2: _beat(1)}, now=0.0)
    assert peers.verdict(1.0) == (2, "as process 1 found: Process 2 of 3 was lost: no heartbeat for 5 s.")
    peers.update({1: _beat(2, "failed", error="KeyboardInterrupt")}, now=1.0)
    assert peers.verdict(1.0) == (1, "it failed: KeyboardInterrupt")
    peers.update({1: _beat(3, "stopped"), 2: _beat(2, "stopped")}, now=2.0)
    assert peers.verdict(100.0) is None


def test_sigterm_relay_sends_stop_chains_the_previous_handler_and_restores_it():
    calls = []

    def previous(signum, frame):
        calls.append("previous")

    before = signal.signal(signal.SIGTERM, previous)
    try:
        relay = SigtermRelay(lambda: calls.append("stop"))
        assert relay.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == ["stop", "previous"]
        relay.retire()  # main thread: restored now
        assert signal.getsignal(signal.SIGTERM) is previous
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == ["stop", "previous", "previous"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_sigterm_relay_leaves_an_ignored_sigterm_alone():
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        relay = SigtermRelay(lambda: pytest.fail("called"))
        assert not relay.install()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_record_names_the_lost_process_and_list_shows_it():
    import json

    from jupyter_traincontrol.control.cli import format_table
    from jupyter_traincontrol.protocol.record import validate_record

    record = {"name": "job", "run_id": "r", "pid": 1, "state": "failed", "process": 0, "num_processes": 2,
              "lost_process": 1, "processes": [{"process": 0, "state": "failed"}, {"process": 1, "state": "lost"}]}
    assert validate_record(json.dumps(record), "job") == (record, "")
    assert "failed (process 1 of 2 lost)" in format_table([record])
    assert "running (2 processes)" in format_table([{**record, "state": "running", "lost_process": None}])
    _, why = validate_record(json.dumps({**record, "lost_process": "1"}), "job")
    assert why == "field 'lost_process' has an unexpected value '1'"


def test_a_sigterm_relay_retired_off_the_main_thread_hands_the_next_sigterm_on():
    import threading

    calls = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("previous"))
    try:
        relay = SigtermRelay(lambda: calls.append("stop"))
        assert relay.install()
        thread = threading.Thread(target=relay.retire)
        thread.start()
        thread.join()
        os.kill(os.getpid(), signal.SIGTERM)  # inert now: restores the previous handler and hands it on
        assert calls == ["previous"]
        assert signal.getsignal(signal.SIGTERM) is not relay._handle
    finally:
        signal.signal(signal.SIGTERM, before)
