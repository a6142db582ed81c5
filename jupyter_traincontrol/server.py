"""The Jupyter server extension's module (its entry point): see `jupyter_traincontrol.control.server`."""

from .control.server import API_PATH, TrainControlApp

__all__ = ["API_PATH", "TrainControlApp"]
