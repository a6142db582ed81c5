"""A fresh run never deletes an earlier run's checkpoints: `keep` counts the run's own line.

A run counts and prunes the checkpoints of its line: those it wrote, and,
once it resumed one, those of the runs it continues (`Checkpoint.lineage`,
the sidecar's ``lineage``). A fresh run under an old name leaves the
earlier run's checkpoints (its ``end`` checkpoint too) and says so in its
first line; a resumed run keeps `keep` of the line, so resume after resume
does not pile them up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driving import fit
from helpers import At, read_sidecar
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition
from jupyter_traincontrol.run.lifecycle import earlier_run_words

NAME = "quickstart"


def _sidecars(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("ckpt-*.json"))


def _run(make_model, tiny_data, ckpt, *, resume: bool = False, epochs: int = 2) -> ControlCallback:
    """One run of `NAME` with keep=2 that writes three checkpoints: a save in
    each of its last two epochs, and its end checkpoint."""
    control = ControlCallback(name=NAME, checkpoint_dir=ckpt, keep=2, resume=resume, save_in_background=False,
                              handle_sigint=False)

    def save(_callback) -> None:
        control.lifecycle.send("save", "test", direct=True)  # acts at the very next boundary

    fit(make_model(), tiny_data, control, At(epochs - 2, 2, save), At(epochs - 1, 2, save), epochs=epochs)
    return control


def _infos(control) -> list[dict]:
    return [read_sidecar(path) for path in control.checkpoints]


# Runs of real fits --------------------------------------------------------------------


def test_a_fresh_run_under_an_old_name_leaves_the_earlier_runs_checkpoints_and_says_so(make_model, tiny_data,
                                                                                        ckpt, capsys):
    first = _run(make_model, tiny_data, ckpt)
    kept_first = [path.name for path in first.checkpoints]
    assert [read_sidecar(ckpt / name)["reason"] for name in kept_first] == ["save", "end"]  # keep=2 of its 3
    assert "earlier run" not in capsys.readouterr().out  # nothing was there before it

    second = _run(make_model, tiny_data, ckpt)  # the cell run again, without --resume
    out = capsys.readouterr().out
    mine = [info for info in _infos(second) if info["run_id"] == second.lifecycle.run_id]
    assert [info["reason"] for info in mine] == ["save", "end"]  # its own 3, pruned to keep=2
    assert all((ckpt / name).exists() for name in kept_first)  # the earlier run's stay, its end checkpoint too
    assert len(_sidecars(ckpt)) == 4
    said = next(line for line in out.splitlines() if "earlier run" in line)
    assert said.startswith(f"[traincontrol] {ckpt} holds 2 checkpoints of an earlier run of this name (newest "
                           f"{kept_first[-1]}, end): they stay") and "--resume, or resume=True" in said
    assert said.index("earlier run") < said.index("is listening")  # the run's first line
    assert any(event["kind"] == "info" and "earlier run" in event["message"] for event in second.lifecycle.journal.events)


def test_a_resumed_run_continues_the_line_and_prunes_it_per_keep(make_model, tiny_data, ckpt, capsys):
    first = _run(make_model, tiny_data, ckpt)
    line = first.lifecycle.run_id
    second = _run(make_model, tiny_data, ckpt, resume=True, epochs=4)
    assert second.session.resumption.checkpoint.path == first.checkpoints[-1]
    assert [(info["reason"], info["lineage"]) for info in _infos(second)] == [("save", line), ("end", line)]
    assert all(info["run_id"] == second.lifecycle.run_id for info in _infos(second))  # the first run's went
    third = _run(make_model, tiny_data, ckpt, resume=True, epochs=6)  # resume after resume: still keep=2
    assert len(_sidecars(ckpt)) == 2 and {info["lineage"] for info in _infos(third)} == {line}
    assert "earlier run" not in capsys.readouterr().out  # a resumed run says where it resumed instead


def test_one_callback_given_to_fit_after_fit_keeps_one_line(make_model, tiny_data, ckpt, capsys):
    """The same `ControlCallback` in a loop of fits (a run each fit): its
    runs are one line, pruned to `keep` together, and none says it found an
    earlier run's checkpoints."""
    control = ControlCallback(name=NAME, checkpoint_dir=ckpt, keep=2, save_in_background=False, handle_sigint=False)
    model = make_model()
    for _ in range(4):
        fit(model, tiny_data, control, epochs=1)  # each writes its end checkpoint
    assert len(_sidecars(ckpt)) == 2
    assert len({read_sidecar(path)["lineage"] for path in control.checkpoints}) == 1
    assert "earlier run" not in capsys.readouterr().out


def test_a_with_block_that_resumes_says_nothing_of_earlier_runs(make_model, tiny_data, ckpt, capsys):
    _run(make_model, tiny_data, ckpt)
    capsys.readouterr()
    control = ControlCallback(name=NAME, checkpoint_dir=ckpt, resume=True, save_at_end=False, handle_sigint=False)
    with control:
        fit(make_model(), tiny_data, control, epochs=3)
    assert "earlier run" not in capsys.readouterr().out
    with ControlCallback(name=NAME, checkpoint_dir=ckpt, save_at_end=False, handle_sigint=False):
        pass
    assert "holds 2 checkpoints of an earlier run" in capsys.readouterr().out


# The store -----------------------------------------------------------------------------


@pytest.fixture
def model(make_model):
    return make_model()


def _step(n: int) -> TrainingPosition:
    return TrainingPosition(epoch=0, step_in_epoch=n, steps_per_epoch=8, global_step=n)


def _save(store: CheckpointStore, model, steps) -> list:
    return [store.save(model, _step(n), reason="save") for n in steps]


def test_keep_counts_the_stores_own_line_and_a_resume_continues_it(tmp_path, model):
    ckdir = tmp_path / "ck"
    a = CheckpointStore(ckdir, keep=2, run=NAME)
    kept_a = _save(a, model, range(3))[1:]
    b = CheckpointStore(ckdir, keep=2, run=NAME)  # a fresh run of the same name
    assert b.lineage == b.run_id and b.earlier() == kept_a
    saved_b = _save(b, model, range(3, 6))
    assert b.list() == [*kept_a, *saved_b[1:]] and b.known == b.list()  # a's stay
    assert all(c.lineage == b.run_id and c.info["lineage"] == b.run_id for c in saved_b)

    c = CheckpointStore(ckdir, keep=2, run=NAME)
    loaded = []
    assert c.restore_latest(loaded.append).checkpoint == saved_b[-1] == loaded[0]
    assert c.lineage == b.run_id and c.looked_for_resume and c.earlier() == kept_a
    (new,) = _save(c, model, [6])
    assert new.info["run_id"] == c.run_id and new.info["lineage"] == b.run_id
    assert c.list() == [*kept_a, saved_b[-1], new]  # b's older one went: c continues b's line


def test_a_store_continues_only_a_checkpoint_of_its_own_name_and_folder(tmp_path, model):
    other = CheckpointStore(tmp_path / "ck", run="other").save(model, _step(1), reason="save")
    store = CheckpointStore(tmp_path / "ck", run=NAME)
    with pytest.raises(ValueError, match=r"cannot continue the line of .*run 'other'.*expected one of its own"):
        store.continue_line(other)
    elsewhere = CheckpointStore(tmp_path / "elsewhere", run=NAME).save(model, _step(1), reason="save")
    with pytest.raises(ValueError, match="expected one of its own checkpoints"):
        store.continue_line(elsewhere)
    assert store.lineage == store.run_id


def test_checkpoints_without_a_lineage_are_their_runs_own_line_or_the_legacy_one(tmp_path, model):
    """Sidecars written before ``lineage`` (format 2 without it, format 1 without run_id) still read."""
    ckdir = tmp_path / "ck"
    old = CheckpointStore(ckdir, keep=5, run=NAME)
    first, second = _save(old, model, [1, 2])
    for checkpoint, drop in ((first, ("lineage",)), (second, ("lineage", "tool", "run_id"))):
        info = json.loads(checkpoint.sidecar.read_text())
        for key in drop:
            del info[key]
        checkpoint.sidecar.write_text(json.dumps({**info, "format": 2 if "tool" in info else 1}))
    first, second = CheckpointStore(ckdir, run=NAME).list()
    assert first.lineage == old.run_id and second.lineage == "0" * 32
    fresh = CheckpointStore(ckdir, keep=1, run=NAME)
    _save(fresh, model, [3, 4])
    assert fresh.earlier() == [first, second]  # neither is the fresh run's to remove


def test_the_words_of_earlier_checkpoints(tmp_path, model):
    ckdir = tmp_path / "ck"
    assert earlier_run_words(ckdir, []) is None
    one = _save(CheckpointStore(ckdir, run=NAME), model, [1])
    two = _save(CheckpointStore(ckdir, run=NAME), model, [2, 3])
    words = earlier_run_words(ckdir, [*one, *two])
    assert words.startswith(f"{ckdir} holds 3 checkpoints of 2 earlier runs of this name (newest {two[-1].path.name}, "
                            "save): they stay")
    assert "holds 1 checkpoint of an earlier run" in earlier_run_words(ckdir, one)
