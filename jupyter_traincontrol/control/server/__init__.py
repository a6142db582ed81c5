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

from jupyter_server.extension.application import ExtensionApp
from traitlets import Int

from .handlers import EXECUTOR_SETTING, CommandsHandler, RunsHandler, VocabularyHandler

__all__ = ["API_PATH", "TrainControlApp"]

#: Where the API lives, under the server's base URL.
API_PATH = "traincontrol/api"


class TrainControlApp(ExtensionApp):
    """Adds the training runs API to a Jupyter server, and owns its thread pool.

    The pool runs registry reads and FIFO writes, so that file work never
    stalls the server's event loop; it is shut down when the server stops.
    """

    name = "jupyter_traincontrol"
    load_other_extensions = True

    threads = Int(
        4,
        help="Threads that read run records and write commands to FIFOs, off the server's event loop.",
    ).tag(config=True)

    def initialize_settings(self) -> None:
        self.settings[EXECUTOR_SETTING] = ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="traincontrol-server"
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (f"{API_PATH}/runs", RunsHandler),
                (f"{API_PATH}/commands", VocabularyHandler),
                (rf"{API_PATH}/runs/(?P<name>[^/]+)/commands", CommandsHandler),
            ]
        )
        self.log.info("jupyter_traincontrol: training runs API at %s/runs", API_PATH)

    async def stop_extension(self) -> None:
        """Shuts the thread pool down (the server is stopping)."""
        executor = self.serverapp.web_app.settings.pop(EXECUTOR_SETTING, None)
        if executor is not None:
            executor.shutdown(wait=True)
