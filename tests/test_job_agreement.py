"""A job's agreement against the real JAX coordination service, in a
one-process job (`tests/programs/agreement_probe.py`): the multi-process
runs are in test_distributed.py."""

from __future__ import annotations

import json

import pytest

from helpers import TESTS_DIR, free_port, run_program

pytest.importorskip("jax")
pytestmark = pytest.mark.backends("tensorflow", reason="the probe runs JAX itself; one pass of the matrix is enough")


def test_an_end_marker_wakes_a_watcher_blocked_on_the_next_proposal_and_is_passed_over():
    # Ending a fit joins the job's watcher: without the marker, its blocking
    # read would hold that end until the read timed out (here a minute).
    done = run_program(str(TESTS_DIR / "programs" / "agreement_probe.py"), str(free_port()), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["received"] is True
    assert result["waited"] < result["block_seconds"] / 2, result
    # The marker takes a number of its own: the next proposal is received and agreed as usual.
    assert result["after_marker"] is True
    assert result["request"] == ["save", "probe-1"]
