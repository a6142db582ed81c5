"""Root conftest: pytest-jupyter's Jupyter Server fixtures (``jp_serverapp``, ``jp_fetch``).

They are used by ``tests/test_server.py``; ``tests/conftest.py`` keeps the
per-test runtime dir and the leak check, which apply to those tests too.
"""

pytest_plugins = ("pytest_jupyter.jupyter_server",)
