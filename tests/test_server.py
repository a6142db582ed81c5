"""The server extension's REST API, against a real Jupyter server (pytest-jupyter).

Runs are real: a `RunLifecycle` listening in this process (no Keras needed to
receive commands), and the example training script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.cookies import SimpleCookie

import pytest
import tornado.httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_server.serverapp import ServerApp

from helpers import child_env, read_sidecar
from jupyter_traincontrol.control.cli import main as cli_main
from jupyter_traincontrol.protocol import Command
from jupyter_traincontrol.run import RunLifecycle
from jupyter_traincontrol.registry import registry_root
from jupyter_traincontrol.control.server.handlers import BadBodyError, command_from_body

API = ("traincontrol", "api")
_json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["command", "cmd", "x"]) | st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"jupyter_traincontrol": True}}}


@pytest.fixture
def api(jp_fetch, jp_serverapp, jp_asyncio_loop):
    """`jp_fetch`, with the server stopped at teardown, before the leak check.

    pytest-jupyter stops its server in an autouse fixture that ends after
    ours, so the leak check would see the extension's thread pool alive.
    Stopping it here also checks that unloading the extension ends the pool.
    """
    yield jp_fetch
    jp_asyncio_loop.run_until_complete(jp_serverapp._cleanup())
    jp_serverapp.kernel_manager.context.destroy()
    ServerApp.clear_instance()






async def get_runs(api) -> list[dict]:
    response = await api(*API, "runs")
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def post_command(api, name: str, body, **kwargs):
    """POSTs `body` (JSON-encoded unless bytes); returns (code, decoded reply)."""
    payload = body if isinstance(body, bytes) else json.dumps(body)
    try:
        response = await api(*API, "runs", name, "commands", method="POST", body=payload, **kwargs)
    except tornado.httpclient.HTTPClientError as error:
        return error.code, json.loads(error.response.body)
    return response.code, json.loads(response.body)


async def test_no_runs_is_an_empty_list(api):
    assert await get_runs(api) == []


async def test_runs_are_the_cli_records_plus_kernel_fields(api, live_run, capsys):
    runs = await get_runs(api)
    assert cli_main(["list", "--json"]) == 0
    cli_records = json.loads(capsys.readouterr().out)
    assert [run["name"] for run in runs] == ["alpha"]
    (run,) = runs
    added = {key: run.pop(key) for key in ("kernel_id", "kernel_on_this_server", "notebook_path")}
    assert added == {"kernel_id": None, "kernel_on_this_server": False, "notebook_path": None}
    assert run == cli_records[0]
    assert run["state"] == "running" and run["epoch"] == 3 and run["metrics"] == {"loss": 0.213456}
    assert run["history"] == [{"epoch": 1, "loss": 0.5, "val_loss": 0.6}]
    assert "pid_start" not in run


async def test_a_run_of_a_kernel_of_this_server_names_its_notebook(api, tmp_path):
    reply = await api(
        "api", "sessions", method="POST",
        body=json.dumps({"path": "experiments/mnist.ipynb", "type": "notebook", "kernel": {"name": "echo"}}),
    )
    session = json.loads(reply.body)
    kernel_id = session["kernel"]["id"]
    ours = RunLifecycle("in-kernel", tmp_path / "a", extra_record={"kernel_id": kernel_id}).open()
    elsewhere = RunLifecycle("other-server", tmp_path / "b", extra_record={"kernel_id": "f" * 32}).open()
    try:
        runs = {run["name"]: run for run in await get_runs(api)}
    finally:
        ours.close("stopped")
        elsewhere.close("stopped")
        await api("api", "sessions", session["id"], method="DELETE")
    assert runs["in-kernel"]["kernel_id"] == kernel_id
    assert runs["in-kernel"]["kernel_on_this_server"] is True
    assert runs["in-kernel"]["notebook_path"] == "experiments/mnist.ipynb"
    assert runs["other-server"]["kernel_id"] == "f" * 32
    assert runs["other-server"]["kernel_on_this_server"] is False
    assert runs["other-server"]["notebook_path"] is None


async def test_post_delivers_the_command_through_the_fifo(api, live_run):
    code, reply = await post_command(api, "alpha", {"command": "save"})
    request_id = reply.pop("id")
    assert (code, reply) == (202, {"name": "alpha", "command": "save", "message": "Sent save to alpha."})
    delivered = live_run.channel.get(5)
    assert (delivered.command, delivered.request_id) == (Command.SAVE, request_id)  # the run can acknowledge it


async def test_post_delivers_set_and_rollback_lines_and_the_record_has_tunables(api, live_run):
    live_run.source.tunables = {"learning_rate": 0.01}
    live_run.source.version += 1
    live_run.publish(force=True)
    code, reply = await post_command(api, "alpha", {"command": "set lr=1e-4"})
    assert (code, reply["command"]) == (202, "set learning_rate=0.0001")
    assert reply["id"].startswith("rest-")
    assert (await post_command(api, "alpha", {"command": "rollback 2"}))[0] == 202
    assert [str(live_run.channel.get(5)) for _ in range(2)] == ["set learning_rate=0.0001", "rollback 2"]
    code, reply = await post_command(api, "alpha", {"command": "set lr=-"})
    assert code == 400 and "takes a finite number" in reply["message"]
    (run,) = await get_runs(api)
    assert run["tunables"] == {"learning_rate": 0.01} and run["changes"] == []


@pytest.mark.parametrize(
    "body, message",
    [
        ({"command": "frobnicate"}, "Unknown command 'frobnicate'. Expected one of: stop, save, abort, pause, resume, set, rollback."),
        (b"stop", "The body is not JSON: 'stop'."),
        (b"", "The body is not JSON: ''."),
        (["stop"], 'Got ["stop"].'),
        ({"cmd": "stop"}, 'Got {"cmd": "stop"}.'),
        ({"command": 3}, "Got command 3, not a string."),
    ],
)
async def test_a_bad_command_or_body_is_400_and_says_what_is_expected(api, live_run, body, message):
    code, reply = await post_command(api, "alpha", body)
    assert code == 400
    assert reply["message"].startswith(message)
    if not message.startswith("Unknown command"):
        assert reply["message"].endswith(
            'Expected a JSON object like {"command": "stop"} with a command among: stop, save, abort, pause, resume, set, rollback.'
        )
    assert not live_run.channel.pending


async def test_an_unknown_run_is_404(api, live_run):
    code, reply = await post_command(api, "nobody", {"command": "stop"})
    assert (code, reply["message"]) == (404, "No run named 'nobody'. Runs listed: alpha.")


async def test_an_ended_run_is_409(api, tmp_path):
    control = RunLifecycle("done", tmp_path / "ck").open()
    control.close("finished")
    code, reply = await post_command(api, "done", {"command": "stop"})
    assert (code, reply["message"]) == (409, "Run 'done' has ended (finished); it takes no more commands.")


async def test_a_run_whose_reader_is_gone_is_409(api, live_run):
    live_run.channel.close()  # the record still says running, but nobody reads the FIFO
    code, reply = await post_command(api, "alpha", {"command": "stop"})
    assert code == 409 and "is not listening any more" in reply["message"]


@pytest.mark.parametrize("method, path", [("GET", ("runs",)), ("POST", ("runs", "alpha", "commands"))])
async def test_requests_without_a_token_are_403(api, live_run, method, path):
    body = json.dumps({"command": "stop"}) if method == "POST" else None
    with pytest.raises(tornado.httpclient.HTTPClientError) as error:
        await api(*API, *path, method=method, body=body, headers={"Authorization": ""})
    assert error.value.code == 403
    assert json.loads(error.value.response.body)["message"]
    assert not live_run.channel.pending


async def test_a_cookie_authenticated_post_needs_the_xsrf_token(api, live_run):
    """As for every Jupyter API: a login cookie alone does not allow a POST."""
    first = await api(*API, "runs")  # token-authenticated: the server sets a login cookie
    cookie = SimpleCookie()
    for header in first.headers.get_list("Set-Cookie"):
        cookie.load(header)
    login = "; ".join(f"{key}={morsel.value}" for key, morsel in cookie.items())
    assert login, "the server set no login cookie"
    without_token = {"Authorization": ""}
    response = await api(*API, "runs", headers={**without_token, "Cookie": login})
    assert [run["name"] for run in json.loads(response.body)] == ["alpha"]

    code, reply = await post_command(api, "alpha", {"command": "save"}, headers={**without_token, "Cookie": login})
    assert code == 403 and "_xsrf" in reply["message"]
    assert not live_run.channel.pending

    xsrf = {"Cookie": f"{login}; _xsrf=abc123", "X-XSRFToken": "abc123"}
    code, reply = await post_command(api, "alpha", {"command": "save"}, headers={**without_token, **xsrf})
    assert code == 202, reply
    assert live_run.channel.get(5).command is Command.SAVE


async def test_registry_reads_and_fifo_writes_run_off_the_event_loop(api, live_run, monkeypatch):
    from jupyter_traincontrol.control.server import handlers

    threads = []

    def spy(function):
        def wrapper(*args):
            threads.append(threading.current_thread().name)
            return function(*args)

        return wrapper

    monkeypatch.setattr(handlers, "public_records", spy(handlers.public_records))
    monkeypatch.setattr(handlers, "send", spy(handlers.send))
    await get_runs(api)
    assert (await post_command(api, "alpha", {"command": "save"}))[0] == 202
    assert len(threads) == 2
    assert all(name.startswith("traincontrol-server") for name in threads), threads
    assert threading.current_thread().name not in threads
    assert live_run.channel.get(5).command is Command.SAVE


async def test_a_training_script_is_listed_and_stopped_through_the_api(api, training, tmp_path):
    script = training("--name", "api-run", "--checkpoint-dir", str(tmp_path / "ck"), "--epochs", "200")
    (run,) = await get_runs(api)
    assert (run["name"], run["state"], run["pid"]) == ("api-run", "running", script.process.pid)
    assert run["origin"] == "train_with_control.py" and run["epochs"] == 200
    assert run["fifo"] == script.fifo and run["kernel_id"] is None

    code, reply = await post_command(api, "api-run", {"command": "stop"})
    assert (code, reply["message"]) == (202, "Sent stop to api-run.")
    exit_code, result, err = script.finish()
    assert exit_code == 0, err
    assert result["state"] == "stopped" and len(result["checkpoints"]) == 1
    assert read_sidecar(result["checkpoints"][0])["reason"] == "stop"
    assert await get_runs(api) == []  # its process is gone, and its record with it
    code, reply = await post_command(api, "api-run", {"command": "stop"})
    assert code == 404


def test_the_server_extension_does_not_import_keras():
    code = (
        "import sys, jupyter_traincontrol, jupyter_traincontrol.server; "
        "points = jupyter_traincontrol._jupyter_server_extension_points(); "
        "assert points[0]['app'].name == 'jupyter_traincontrol', points; "
        "sys.exit(bool({'keras', 'tensorflow'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], env=child_env()).returncode == 0


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=600), _json_bodies.map(lambda value: json.dumps(value).encode())))
def test_any_body_is_a_command_text_or_one_clear_error(raw):
    try:
        command = command_from_body(raw)
    except BadBodyError as error:
        assert str(error) and len(str(error)) < 400
    else:
        assert isinstance(command, str)


@pytest.mark.parametrize("body", [b"[" * 3000 + b"]" * 3000, b'{"command": ' + b"[" * 2000 + b"]" * 2000 + b"}", b"x" * 100_000])
async def test_deep_or_huge_bodies_are_400_not_500(api, live_run, body):
    code, reply = await post_command(api, "alpha", body)
    assert code == 400 and reply["message"]
    assert not live_run.channel.pending


async def test_a_post_reads_its_run_only_not_the_whole_registry(api, live_run, monkeypatch):
    from jupyter_traincontrol import registry

    scans = []
    real = registry.list_runs
    monkeypatch.setattr(registry, "list_runs", lambda *args, **kwargs: scans.append(1) or real(*args, **kwargs))
    assert (await post_command(api, "alpha", {"command": "save"}))[0] == 202
    assert scans == []


async def test_a_malformed_record_beside_good_ones_is_skipped_not_a_500(api, live_run):
    folder = registry_root() / "broken"
    folder.mkdir(mode=0o700)
    (folder / "run.json").write_text('{"name": "broken", "pid": 1')
    os.link(live_run._folder.path / "lock", folder / "lock")  # "alive": not cleaned away
    assert [run["name"] for run in await get_runs(api)] == ["alpha"]
    code, reply = await post_command(api, "broken", {"command": "stop"})
    assert code == 404 and "No run named 'broken'" in reply["message"]


async def test_vocabulary_is_served_for_the_side_panel(api):
    response = await api(*API, "commands")
    vocabulary = json.loads(response.body)
    assert [c["name"] for c in vocabulary["commands"]] == ["stop", "save", "abort", "pause", "resume", "set", "rollback"]
    assert vocabulary["allowed"]["running"][-2:] == ["set", "rollback"]
    assert vocabulary["allowed"]["stopping"] == ["abort"] and vocabulary["allowed"]["finished"] == []


async def test_runs_all_true_adds_the_ended_runs_of_the_history(api, live_run, tmp_path, capsys):
    ended = RunLifecycle("ended", tmp_path / "e").open()
    ended.close("aborted")
    ended.forget()  # its folder goes: the history keeps its last record
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal; from jupyter_traincontrol.run import RunLifecycle; "
         f"RunLifecycle('killed', {str(tmp_path / 'k')!r}).open().move_to('running'); os.kill(os.getpid(), signal.SIGKILL)"],
        env=child_env(registry_root().parent), timeout=60)
    assert killed.returncode == -9
    assert [run["name"] for run in await get_runs(api)] == ["alpha"]  # without the parameter: as before
    response = await api(*API, "runs", params={"all": "true"})
    runs = json.loads(response.body)
    assert [(run["name"], run["live"], run["end_reason"]) for run in runs] == [
        ("alpha", True, None), ("ended", False, "command"), ("killed", False, "process-gone")]
    assert all({"kernel_id", "kernel_on_this_server", "notebook_path"} <= set(run) for run in runs)
    assert cli_main(["list", "--all", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [{k: v for k, v in run.items() if k not in ("kernel_id", "kernel_on_this_server", "notebook_path")}
            for run in runs] == listed  # the same records as `list --all --json`
    with pytest.raises(tornado.httpclient.HTTPClientError) as error:
        await api(*API, "runs", params={"all": "maybe"})
    assert error.value.code == 400
    assert json.loads(error.value.response.body)["message"] == "Got all='maybe'; expected all=true or all=false."


async def test_a_post_may_say_it_comes_from_the_notebook_panel(api, live_run):
    code, reply = await post_command(api, "alpha", {"command": "save", "sender": "notebook-panel"})
    assert code == 202 and reply["id"].startswith("nbpanel-")
    assert live_run.channel.get(5).request_id == reply["id"]
    code, reply = await post_command(api, "alpha", {"command": "save", "sender": "me"})
    assert code == 400
    assert reply["message"] == 'Got sender "me"; expected one of: side-panel, notebook-panel, or none.'
    assert not live_run.channel.pending
