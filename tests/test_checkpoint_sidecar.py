"""Sidecars: a strict reader, NaN as null, and resuming past broken checkpoints."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import read_sidecar as read_sidecar_json
from jupyter_traincontrol import ControlCallback
from jupyter_traincontrol.state import KerasState
from jupyter_traincontrol.checkpoint import (
    CheckpointStore,
    MalformedSidecarError,
    TrainingPosition,
    parse_sidecar,
)
from jupyter_traincontrol.protocol.values import json_safe
from jupyter_traincontrol.system.private_fs import write_json_atomic

NAME = "ckpt-000001-epoch0001-step000001.json"


def _valid(**changes) -> dict:
    info = {
        "tool": "jupyter-traincontrol", "format": 2, "run": "r", "run_id": "0" * 32, "sequence": 1,
        "file": NAME.replace(".json", ".keras"), "size": 100, "epoch": 0, "step_in_epoch": 1,
        "steps_per_epoch": 8, "epoch_complete": False, "global_step": 1, "resume_epoch": 0, "resume_step": 1,
        "metrics": {"loss": 0.5}, "reason": "save", "time": "2026-01-01T00:00:00+00:00",
    }
    info.update(changes)
    return {key: value for key, value in info.items() if value is not _DROP}


_DROP = object()


@pytest.fixture
def trained(make_model, tiny_data):
    model = make_model()
    model.fit(*tiny_data, batch_size=8, epochs=1, verbose=0)
    return model


# The strict reader ------------------------------------------------------------------


def test_a_valid_sidecar_reads_back_as_written():
    assert parse_sidecar(json.dumps(_valid()).encode(), NAME) == _valid()


MALFORMED = {
    "empty": b"",
    "truncated": json.dumps(_valid()).encode()[:-20],
    "not utf-8": b"\xff\xfe{}",
    "a list": b"[1, 2]",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "a huge number": json.dumps(_valid(epoch=2**80)).encode(),
    "a 5000-digit number": b'{"format": 2, "epoch": ' + b"9" * 5000 + b"}",
    "NaN as a step": json.dumps(_valid()).replace('"step_in_epoch": 1', '"step_in_epoch": NaN').encode(),
    "no format": json.dumps(_valid(format=_DROP)).encode(),
    "format 3": json.dumps(_valid(format=3)).encode(),
    "format true": json.dumps(_valid(format=True)).encode(),
    "another tool": json.dumps(_valid(tool="other")).encode(),
    "run a number": json.dumps(_valid(run=7)).encode(),
    "run empty": json.dumps(_valid(run="")).encode(),
    "run_id short": json.dumps(_valid(run_id="abc")).encode(),
    "lineage short": json.dumps(_valid(lineage="abc")).encode(),
    "file with a folder": json.dumps(_valid(file="../ckpt-000001-epoch0001-step000001.keras")).encode(),
    "file absolute": json.dumps(_valid(file="/etc/passwd")).encode(),
    "file of another name": json.dumps(_valid(file="other.keras")).encode(),
    "size a string": json.dumps(_valid(size="100")).encode(),
    "size negative": json.dumps(_valid(size=-1)).encode(),
    "size zero": json.dumps(_valid(size=0)).encode(),
    "epoch a float": json.dumps(_valid(epoch=1.0)).encode(),
    "epoch a bool": json.dumps(_valid(epoch=True)).encode(),
    "epoch_complete a number": json.dumps(_valid(epoch_complete=1)).encode(),
    "sequence zero": json.dumps(_valid(sequence=0)).encode(),
    "metrics a list": json.dumps(_valid(metrics=[1])).encode(),
    "metric a string": json.dumps(_valid(metrics={"loss": "low"})).encode(),
    "metric a bool": json.dumps(_valid(metrics={"loss": True})).encode(),
    "reason an object": json.dumps(_valid(reason={})).encode(),
    "missing metrics": json.dumps(_valid(metrics=_DROP)).encode(),
    "too big": json.dumps(_valid(metrics={f"m{i}": 1.0 for i in range(900)}, padding="x" * 70_000)).encode(),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_sidecar_is_refused_with_a_clear_error(kind):
    with pytest.raises(MalformedSidecarError, match=rf"^{NAME}: .*expected"):
        parse_sidecar(MALFORMED[kind], NAME)


def test_malformed_sidecars_are_skipped_by_list(tmp_path, trained):
    store = CheckpointStore(tmp_path / "ck", run="r")
    good = store.save(trained, TrainingPosition(0, 1), reason="save")
    for index, data in enumerate(MALFORMED.values(), start=10):
        stem = f"ckpt-{index:06d}-epoch0001-step000001"
        (tmp_path / "ck" / f"{stem}.keras").write_bytes(good.path.read_bytes())
        (tmp_path / "ck" / f"{stem}.json").write_bytes(data)
    (tmp_path / "ck" / "ckpt-000099-epoch0001-step000001.json").mkdir()  # a folder named like a sidecar
    os.mkfifo(tmp_path / "ck" / "ckpt-000098-epoch0001-step000001.json")  # would block a plain open
    (tmp_path / "ck" / "ckpt-000097-epoch0001-step000001.json").symlink_to(good.sidecar)
    assert store.list() == [good]


def test_a_non_finite_metric_of_a_hand_edited_sidecar_reads_as_null():
    text = json.dumps(_valid()).replace('"loss": 0.5', '"loss": Infinity, "acc": NaN')
    assert parse_sidecar(text.encode(), NAME)["metrics"] == {"loss": None, "acc": None}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise_anything_but_the_readers_error(data):
    try:
        parse_sidecar(data, NAME)
    except MalformedSidecarError:
        pass  # the reader's own error: "not a checkpoint"


@settings(max_examples=300, deadline=None)
@given(_json)
def test_arbitrary_json_never_raises_anything_but_the_readers_error(value):
    try:
        parse_sidecar(json.dumps(value).encode(), NAME)
    except MalformedSidecarError:
        pass


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(_valid())), _json)
def test_any_value_in_any_field_is_accepted_only_if_sane(field, value):
    try:
        info = parse_sidecar(json.dumps(_valid(**{field: value})).encode(), NAME)
    except MalformedSidecarError as error:
        assert str(error).startswith(f"{NAME}: ") and "expected" in str(error)
        return
    assert set(info) == set(_valid())
    for key in ("sequence", "size", "epoch", "step_in_epoch", "resume_epoch", "resume_step"):
        assert type(info[key]) is int and 0 <= info[key] <= 2**62
    assert "/" not in info["file"] and info["file"] == NAME.replace(".json", ".keras")
    assert isinstance(info["run"], str) and info["run"]
    assert all(v is None or math.isfinite(v) for v in info["metrics"].values())


# NaN and infinities ----------------------------------------------------------------


def test_json_safe_turns_non_finite_numbers_into_none():
    value = {"a": float("nan"), "b": [np.float32("inf"), (1.5, -math.inf)], "c": 3, "d": "nan", "e": True}
    assert json_safe(value) == {"a": None, "b": [None, [1.5, None]], "c": 3, "d": "nan", "e": True}


def test_nan_metrics_are_null_in_the_sidecar(tmp_path, trained):
    metrics = {"loss": np.float32("nan"), "val_loss": float("inf"), "acc": 0.25}
    checkpoint = CheckpointStore(tmp_path).save(trained, TrainingPosition(0, 1), reason="save", metrics=metrics)
    text = checkpoint.sidecar.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["metrics"] == {"loss": None, "val_loss": None, "acc": 0.25}
    assert CheckpointStore(tmp_path).latest() == checkpoint


def test_nan_in_a_record_is_written_as_null(tmp_path):
    write_json_atomic(tmp_path / "record.json", {"metrics": {"loss": float("nan")}, "history": [{"x": -math.inf}]})
    assert json.loads((tmp_path / "record.json").read_text()) == {"metrics": {"loss": None}, "history": [{"x": None}]}


def test_nan_metrics_are_written_as_null_in_the_sidecar(make_model, tmp_path):
    # A fit whose loss is not finite writes no checkpoint at all (on_nan, see
    # test_steering.py); metrics that are NaN while the weights are finite
    # (a NaN validation metric, say) are null in the sidecar.
    store = CheckpointStore(tmp_path / "ck", run="nan")
    checkpoint = store.save(make_model(), TrainingPosition(0, 1), reason="save", metrics={"loss": 1.0, "val_loss": float("nan")})
    assert read_sidecar_json(checkpoint.path)["metrics"] == {"loss": 1.0, "val_loss": None}
    assert "NaN" not in checkpoint.sidecar.read_text()


# Resuming past broken checkpoints ---------------------------------------------------------


def _weights(model):
    return [np.array(v) for v in model.weights + model.optimizer.variables]


def test_resume_skips_a_newer_corrupt_checkpoint_and_says_which_and_why(tmp_path, trained, make_model):
    store = CheckpointStore(tmp_path, run="r")
    good = store.save(trained, TrainingPosition(0, 1), reason="save")
    corrupt = store.save(trained, TrainingPosition(0, 2), reason="save")
    size = corrupt.path.stat().st_size
    corrupt.path.write_bytes(b"\0" * size)  # the same size: only loading tells
    truncated = store.save(trained, TrainingPosition(0, 3), reason="save")
    (tmp_path / truncated.sidecar.name).write_text('{"format": 2, "tool": "jupyter-tr')  # a torn sidecar
    seen = []
    restored = store.restore_latest(KerasState(make_model(seed=5)).restore, on_skip=seen.append)
    assert restored.checkpoint == good
    assert [s.path.name for s in restored.skipped] == [truncated.sidecar.name, corrupt.path.name]
    assert seen == restored.skipped
    assert "not JSON" in restored.skipped[0].reason
    assert restored.skipped[1].reason.startswith(f"Could not load {corrupt.path}")


def test_with_nothing_loadable_the_model_is_left_as_it_was(tmp_path, trained, make_model):
    store = CheckpointStore(tmp_path, run="r")
    only = store.save(trained, TrainingPosition(0, 1), reason="save")
    data = bytearray(only.path.read_bytes())
    data[len(data) // 2:] = b"\0" * (len(data) - len(data) // 2)  # the zip's end and directory gone
    only.path.write_bytes(bytes(data))
    fresh = make_model(seed=6)
    fresh.optimizer.build(fresh.trainable_variables)
    before = _weights(fresh)
    restored = store.restore_latest(KerasState(fresh).restore)
    assert restored.checkpoint is None and [s.path for s in restored.skipped] == [only.path]
    for a, b in zip(before, _weights(fresh)):
        np.testing.assert_array_equal(a, b)


def test_a_resumed_fit_skips_a_broken_checkpoint_and_says_so(make_model, tiny_data, tmp_path, capsys):
    from helpers import At, EventLog

    first = ControlCallback(name="r", checkpoint_dir=tmp_path / "ck", keep=5, verbose=False)
    make_model().fit(*tiny_data, batch_size=8, epochs=3, verbose=0,
                     callbacks=[first, At(0, 7, lambda cb: first.send("save")), At(1, 7, lambda cb: first.send("stop"))])
    older, newer = first.checkpoints
    newer.write_bytes(b"\0" * newer.stat().st_size)
    log = EventLog()
    resumed = ControlCallback(name="r", checkpoint_dir=tmp_path / "ck", resume=True)
    resumed.lifecycle.add_listener(log)
    history = make_model(seed=8).fit(*tiny_data, batch_size=8, epochs=3, verbose=0, callbacks=[resumed])
    assert history.epoch == [1, 2]  # from the older one: epoch 0 complete
    (warning,) = [m for m in log.messages("warning") if m.startswith("Resume skipped")]
    assert warning.startswith(f"Resume skipped {newer.name}: Could not load")
    out = capsys.readouterr()
    assert f"Resume skipped {newer.name}" in out.err and f"Resumed from {older}" in out.out


def test_a_resume_with_nothing_loadable_starts_fresh_and_says_so(make_model, tiny_data, tmp_path, capsys):
    store = CheckpointStore(tmp_path / "ck", run="r")
    broken = store.save(make_model(), TrainingPosition(2, 1), reason="save")
    broken.path.write_bytes(b"\0" * broken.path.stat().st_size)
    history = make_model().fit(*tiny_data, batch_size=8, epochs=2, verbose=0,
                               callbacks=[ControlCallback(name="r", checkpoint_dir=tmp_path / "ck", resume=True)])
    assert history.epoch == [0, 1]
    out = capsys.readouterr()
    assert f"No checkpoint in {tmp_path / 'ck'} loads (1 skipped): starting from scratch." in out.out
    assert f"Resume skipped {broken.path.name}" in out.err
