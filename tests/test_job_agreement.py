"""A job's agreement against the real JAX coordination service, in a
one-process job (`tests/programs/agreement_probe.py`): the multi-process
runs are in test_distributed.py."""

from __future__ import annotations

import json

import pytest

from helpers import TESTS_DIR, free_port, run_program

pytest.importorskip("jax")
pytestmark = pytest.mark.backends("tensorflow", reason="the probe runs JAX itself; one pass of the matrix is enough")


@pytest.fixture(scope="module")
def probe() -> dict:
    """What the probe printed (one job, for every test of this module)."""
    done = run_program(str(TESTS_DIR / "programs" / "agreement_probe.py"), str(free_port()), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_end_marker_wakes_a_watcher_blocked_on_the_next_proposal_and_is_passed_over(probe):
    # Ending a fit joins the job's watcher: without the marker, its blocking
    # read would hold that end until the read timed out (here a minute).
    assert probe["received"] is True
    assert probe["waited"] < probe["block_seconds"] / 2, probe
    # The marker takes a number of its own: the next proposal is received and agreed as usual.
    assert probe["after_marker"] is True
    assert probe["request"] == ["save", "probe-1"]


def test_a_proposal_made_while_a_request_is_due_at_the_step_begun_is_agreed_for_that_step(probe):
    """A 4-process job paused at a step; a process had begun that step when a
    save came: it said the next step, where no process ever went while
    paused, so the save was acknowledged only after a resume (seen once in
    a dozen runs of test_distributed's jobs). It says that step now."""
    assert probe["due_at_21"] == ["pause", "save"], probe
    assert probe["due_at_22"] == [], probe
