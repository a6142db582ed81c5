"""`tf.distribute.MirroredStrategy` in one process (two logical CPU devices):
save, pause, stop and resume work as on one device, and the checkpoint loads
without the strategy."""

from __future__ import annotations

import pytest

from helpers import PROGRAMS, cli, read_sidecar

pytestmark = pytest.mark.backends("tensorflow", reason="MirroredStrategy is TensorFlow's")


def test_a_mirrored_fit_is_saved_paused_stopped_and_resumed(training, tmp_path):
    folder = str(tmp_path / "ck")
    script = str(PROGRAMS / "mirrored_fit.py")
    run = training("--name", "mirrored", "--checkpoint-dir", folder, script=script)
    for command in ("save", "pause", "save", "resume", "stop"):
        result = cli("send", "mirrored", command, "--wait", "60")
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    code, result, err = run.finish()
    assert code == 0, err[-2000:]
    assert result["state"] == "stopped" and result["replicas"] == 2
    stopped_at = result["optimizer_step"]
    assert [read_sidecar(path)["reason"] for path in result["checkpoints"]] == ["save", "save", "stop"]

    # The checkpoint loads without the strategy, optimizer state included.
    import keras

    loaded = keras.models.load_model(result["checkpoints"][-1])
    # Seen once in a full run (16 == 17): each checkpoint's sidecar and the run's output, to tell why.
    told = [read_sidecar(path) for path in result["checkpoints"]], err[-3000:]
    assert int(loaded.optimizer.iterations.numpy()) == stopped_at, told

    # A few epochs beyond the stopped one: on a loaded machine the first run can train past any fixed
    # count before its stop, and a resume at or past `epochs` trains nothing (it never says READY).
    epochs = str(result["epochs"][-1] + 3)
    resumed = training("--name", "mirrored", "--checkpoint-dir", folder, "--resume", "--epochs", epochs, script=script)
    code, result, err = resumed.finish(timeout=120)
    assert code == 0, err[-2000:]
    assert result["state"] == "finished" and result["optimizer_step"] > stopped_at
    assert "Resumed from" in err or result["epochs"][0] > 0
