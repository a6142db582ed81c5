"""The senders in other processes, without Keras: the client API, the CLI, the REST API.

- `client`: find a run by name, send it a command, wait for its acknowledgement.
- `cli`: ``jupyter-traincontrol list / send``.
- `server/`: the Jupyter server extension's REST API, which the JupyterLab
  side panel uses.
"""
