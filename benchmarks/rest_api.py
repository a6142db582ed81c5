"""The REST API under load: 50 concurrent POSTs with 100 runs listed.

A real Jupyter server (a subprocess, with the extension) and 100 live runs
in this process (their records and FIFOs; no Keras needed to receive
commands). Each round sends 50 ``POST runs/<name>/commands`` at once, to 50
different runs, and times until the last answer; a ``GET runs`` of all 100
is timed beside it. A POST reads its own run's folder only, never the whole
registry, so its cost does not grow with the number of runs listed.

Run: ``python benchmarks/rest_api.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import _common

_common.prepare_environment()

import concurrent.futures  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

RUNS, POSTS = 100, 50
TOKEN = "benchmark-token"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(url: str, body: dict | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Authorization", f"token {TOKEN}")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.status


def _start_server(folder, port: int) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={TOKEN}", "--ServerApp.jpserver_extensions={'jupyter_traincontrol': True}",
        f"--ServerApp.root_dir={folder}", "--allow-root",
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))


def main(argv=None) -> None:
    parser = _common.make_parser(__doc__, rounds=9, quick_rounds=2)
    args = _common.parse_args(parser, argv)
    from jupyter_traincontrol.run import RunLifecycle

    with _common.scratch_folder(args.dir, "traincontrol-bench-rest-") as folder:
        runs = [RunLifecycle(f"run-{index:03d}", folder / "ck" / str(index)).open() for index in range(RUNS)]
        port = _free_port()
        server = _start_server(folder, port)
        base = f"http://127.0.0.1:{port}/traincontrol/api"
        try:
            _common.wait_for(lambda: _up(f"{base}/runs"), 60, "the Jupyter server", interval=0.2)
            posts, gets = [], []
            with concurrent.futures.ThreadPoolExecutor(POSTS) as pool:
                for round_index in range(args.rounds + 1):  # the first round warms up
                    targets = [runs[(round_index * POSTS + i) % RUNS].name for i in range(POSTS)]
                    started = time.perf_counter()
                    codes = list(pool.map(lambda name: _call(f"{base}/runs/{name}/commands", {"command": "save"}), targets))
                    elapsed = time.perf_counter() - started
                    if set(codes) != {202}:
                        raise RuntimeError(f"Expected 202 for every POST, got {sorted(set(codes))}.")
                    started = time.perf_counter()
                    _call(f"{base}/runs")
                    if round_index:
                        posts.append(elapsed)
                        gets.append(time.perf_counter() - started)
                    for run in runs:  # nothing trains here: empty the queues
                        while run.channel.pop() is not None:
                            pass
        finally:
            server.terminate()
            server.wait(30)
            for run in runs:
                run.close("stopped")
                run.forget()
    _common.print_table(
        ["what", "median", "worst"],
        [
            [f"{POSTS} concurrent POSTs, {RUNS} runs listed (all answered)", f"{_common.median(posts) * 1000:.0f} ms", f"{max(posts) * 1000:.0f} ms"],
            [f"GET runs ({RUNS} records)", f"{_common.median(gets) * 1000:.0f} ms", f"{max(gets) * 1000:.0f} ms"],
        ],
    )
    _common.print_summary(
        f"rest_api: {POSTS} concurrent POSTs with {RUNS} runs listed answered in {_common.median(posts) * 1000:.0f} ms "
        f"(median of {len(posts)} rounds; goal 1000 ms); GET runs {_common.median(gets) * 1000:.0f} ms"
    )


def _up(url: str) -> bool:
    try:
        return _call(url) == 200
    except OSError:
        return False


if __name__ == "__main__":
    main()
