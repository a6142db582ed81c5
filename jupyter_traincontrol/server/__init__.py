"""The Jupyter server extension: a REST API over the registry of training runs.

Enabled on install (``etc/jupyter/jupyter_server_config.d/jupyter_traincontrol.json``);
by hand: ``jupyter server extension enable jupyter_traincontrol``. It adds
``<base_url>/traincontrol/api/runs`` and
``<base_url>/traincontrol/api/runs/<name>/commands`` (see `handlers`), which
the JupyterLab side panel uses. Like the CLI it reads records and writes
FIFOs only, and never imports Keras.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from jupyter_server.utils import url_path_join

from .handlers import EXECUTOR_SETTING, CommandsHandler, RunsHandler

__all__ = ["API_PATH"]

#: Where the API lives, under the server's base URL.
API_PATH = "traincontrol/api"
_RUN_NAME = r"(?P<name>[^/]+)"


def _load_jupyter_server_extension(server_app) -> None:
    """Adds the API's routes and its thread pool to `server_app`."""
    web_app = server_app.web_app
    base = url_path_join(web_app.settings["base_url"], API_PATH)
    web_app.settings[EXECUTOR_SETTING] = ThreadPoolExecutor(max_workers=4, thread_name_prefix="traincontrol-server")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "runs"), RunsHandler),
            (url_path_join(base, "runs", _RUN_NAME, "commands"), CommandsHandler),
        ],
    )
    server_app.log.info("jupyter_traincontrol: training runs API at %s/runs", base)


def _unload_jupyter_server_extension(server_app) -> None:
    """Shuts the thread pool down (the server is stopping)."""
    executor = server_app.web_app.settings.pop(EXECUTOR_SETTING, None)
    if executor is not None:
        executor.shutdown(wait=True)

