"""What the JupyterLab extension's TypeScript must agree on with the Python package.

The side panel reads records through the REST API; `IRun` in
``labextension/src/api.ts`` is its picture of one. A field added to a record
(``protocol/record.py``, `FIELDS`) without a word in `IRun` is a field no
card shows; a field in `IRun` that nothing writes is a card waiting for
nothing. And the two panels write numbers by one rule, so the learning rate
reads the same in both, and say in the same words how a run ended and how to
go on from one whose process died (the CLI says that too).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest

from helpers import REPO
from jupyter_traincontrol.notebook.panel_text import number_text
from jupyter_traincontrol.protocol import resume_hint
from jupyter_traincontrol.protocol.record import FIELDS

API_TS = REPO / "labextension" / "src" / "api.ts"
FORMAT_JS = REPO / "labextension" / "lib" / "format.js"

#: Fields the registry's lister adds to a record (`registry.listing.list_runs`):
#: ``live``; and an ended run's ``end_reason``, which the history keeps (the
#: contract of issue 20; the same name if `FIELDS` declares it).
LISTER_FIELDS = {"live", "end_reason"}
#: Fields the server adds (`control.server.handlers.RunsHandler`).
SERVER_FIELDS = {"kernel_id", "kernel_on_this_server", "notebook_path"}


def interface_fields(source: str, name: str) -> set[str]:
    """The property names of the TypeScript interface `name` in `source`."""
    match = re.search(rf"export interface {name} \{{\n(.*?)\n\}}", source, re.S)
    assert match, f"no `export interface {name}` in {API_TS}"
    body = re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
    return set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\??:", body, re.M))


def test_the_side_panels_run_lists_every_field_of_a_record():
    declared = interface_fields(API_TS.read_text(), "IRun")
    expected = set(FIELDS) | LISTER_FIELDS | SERVER_FIELDS
    assert not expected - declared, f"record fields missing from IRun in {API_TS}: {sorted(expected - declared)}"
    assert not declared - expected, (
        f"IRun in {API_TS} has fields no record, lister or server writes: {sorted(declared - expected)}"
    )


NEEDS_NODE = pytest.mark.skipif(shutil.which("node") is None, reason="node is missing (it builds the JupyterLab extension)")


def side_panel_map(function: str, values_js: str) -> list:
    """``VALUES.map(FUNCTION)`` of the side panel's built ``format.js``, run by
    node: `values_js` is a JavaScript expression of the values."""
    if not FORMAT_JS.exists():
        pytest.fail(f"{FORMAT_JS} is not built: run `npm run build` in labextension/ (pip install does)")
    module = base64.b64encode(FORMAT_JS.read_bytes()).decode()
    script = (f"const {{ {function} }} = await import('data:text/javascript;base64,{module}');"
              f"console.log(JSON.stringify(({values_js}).map(v => {function}(v))));")
    result = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


NUMBERS = [0.0003, 0.001, 0.01, 0.002, 0.21314, 1e-5, 1.25e-5, 2.5e5, 12345.6, 99999.9, 0.00099996, 1.0, 0.0, -0.5,
           100.0, 1234.5, 0.1, 3.0e-7, 42, float("nan"), float("inf")]


@NEEDS_NODE
def test_both_panels_write_numbers_alike():
    values = json.dumps([value if value == value and abs(value) != float("inf") else str(value) for value in NUMBERS])
    side_panel = side_panel_map("formatNumber", f"{values}.map(v => v === 'nan' ? NaN : v === 'inf' ? Infinity : v)")
    notebook_panel = [number_text(value) for value in NUMBERS]
    assert side_panel == notebook_panel
    assert notebook_panel[:2] == ["3e-4", "0.001"]


ENDED_RECORDS = [
    {"name": "mnist", "origin": "notebook", "end_reason": "process-gone",
     "checkpoints": ["/home/u/ckpt/mnist/ckpt-000001-epoch0001-step000010.keras",
                     "/home/u/ckpt/mnist/ckpt-000004-epoch0009-step000003.keras"]},
    {"name": "agent", "origin": "train.py", "end_reason": "process-gone", "checkpoints": ["ck/ckpt-000002-epoch0002-step000001.pt"]},
    {"name": "none", "origin": "notebook", "end_reason": "process-gone", "checkpoints": []},
    {"name": "done", "origin": "notebook", "end_reason": "finished", "checkpoints": ["ck/ckpt-000001-epoch0003-step000000.keras"]},
]


@NEEDS_NODE
def test_the_side_panel_and_the_cli_say_alike_how_to_continue_a_run_whose_process_died():
    assert side_panel_map("resumeHint", json.dumps(ENDED_RECORDS)) == [resume_hint(record) for record in ENDED_RECORDS]
    assert resume_hint(ENDED_RECORDS[0]) == ("Its newest checkpoint is ckpt-000004-epoch0009-step000003.keras: continue "
                                             "from it with %%interruptible_fit --name mnist --resume.")
    assert resume_hint(ENDED_RECORDS[2]) == resume_hint(ENDED_RECORDS[3]) == ""



OUTCOMES = [
    {"state": "finished", "end_reason": "finished", "epoch": 3},
    {"state": "finished", "end_reason": "finished", "epoch": 0},  # a cell that ran no fit
    {"state": "finished", "end_reason": "callback", "stopped_by": "EarlyStopping", "epoch": 9},
    {"state": "finished", "end_reason": "callback", "stopped_by": None, "epoch": 2},
    {"state": "stopped", "end_reason": "interrupt", "epoch": 4},
    {"state": "aborted", "end_reason": "command", "epoch": 1},
    {"state": "running", "end_reason": "process-gone", "epoch": 7},
    {"state": "failed", "end_reason": "error", "epoch": 0},
]


@NEEDS_NODE
def test_both_panels_say_alike_how_a_run_ended():
    from jupyter_traincontrol.notebook.panel_text import outcome_text

    python = [outcome_text(r["state"], r["end_reason"], r.get("stopped_by"), trained=bool(r["epoch"])) for r in OUTCOMES]
    assert side_panel_map("outcomeText", json.dumps(OUTCOMES)) == python
    assert python[1] == "Ended: nothing trained (the cell ran no fit or TrainLoop)"
