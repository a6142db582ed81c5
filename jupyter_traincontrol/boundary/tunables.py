"""Reading, checking and setting what ``set`` may change in a live run.

`Tunables` knows the optimizer hyperparameters (`OPTIMIZER_HYPERPARAMETERS`,
where the optimizer has them) and the values a user exposes by name
(``ControlCallback(tunables={"dropout": rate_variable})``). It checks a
whole change before it makes any of it (all or nothing), makes it on the
training thread between two batches, and says what changed.

How each value takes effect in a `fit` that is already compiled:

- ``learning_rate``: Keras keeps it in a variable the train step reads, so
  assigning it is enough. An optimizer built with a schedule (or a callable)
  has no such variable: its schedule is replaced by a constant, kept in a
  variable of its own that the optimizer does not track (so a checkpoint
  holds the same optimizer variables as before and still loads into the
  user's model), and the train function is rebuilt once.
- ``weight_decay``, ``momentum``, ``beta_1``, ``beta_2``, ``clipnorm``,
  ``clipvalue``: plain attributes that the traced train step holds as
  constants, so the train function is rebuilt (one retrace, at the next
  batch).
- a user tunable: a Keras variable, assigned.

Under a wrapper (mixed precision's `LossScaleOptimizer`) the optimizer that
does the update is the inner one: its hyperparameters are the ones read,
offered and set.

Example:

>>> tunables = Tunables(model, {"dropout": rate})          # doctest: +SKIP
>>> tunables.apply({"learning_rate": 1e-4})                # doctest: +SKIP
[Change(name='learning_rate', old=0.001, new=0.0001)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

from ..protocol import TUNABLE_ALIASES, UnknownCommandError, validate_tunable_name

__all__ = ["Change", "TunableError", "Tunables", "check_tunable_name", "check_user_tunables", "OPTIMIZER_HYPERPARAMETERS"]

#: The optimizer hyperparameters `set` knows (where the optimizer has them).
OPTIMIZER_HYPERPARAMETERS = ("learning_rate", "weight_decay", "momentum", "beta_1", "beta_2", "clipnorm", "clipvalue")

_CLIPPERS = ("clipnorm", "clipvalue", "global_clipnorm")


class TunableError(ValueError):
    """A ``set`` that cannot be made; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One value changed: its name, the value before and after."""

    name: str
    old: float | None
    new: float


def check_tunable_name(name: str, reserved) -> None:
    """Checks the name of a user's tunable (Keras or torch alike).

    Raises:
        ValueError: For a name that is not a valid one, or that is one of
            `reserved` (the optimizer's hyperparameters) or an alias.
    """
    try:
        canonical = validate_tunable_name(name)
    except UnknownCommandError as error:
        raise ValueError(f"tunables: {error}") from None
    if canonical != name or name in reserved:
        raise ValueError(f"tunables: {name!r} is an optimizer hyperparameter's name; choose another name.")


def check_user_tunables(tunables: Mapping[str, Any] | None) -> dict[str, Any]:
    """Checks the ``tunables=`` a user passes: names to Keras variables.

    Returns:
        A copy of the mapping.

    Raises:
        ValueError: For a name that is not a valid one, clashes with an
            optimizer hyperparameter, or a value that is not a variable
            (it needs ``assign`` and ``numpy``).
    """
    if tunables is None:
        return {}
    if not isinstance(tunables, Mapping):
        raise ValueError(f"tunables must be a dict of names to Keras variables, got {type(tunables).__name__}.")
    checked = {}
    for name, variable in tunables.items():
        check_tunable_name(name, OPTIMIZER_HYPERPARAMETERS)
        if not (callable(getattr(variable, "assign", None)) and callable(getattr(variable, "numpy", None))):
            raise ValueError(
                f"tunables[{name!r}] is a {type(variable).__name__}; expected a Keras variable "
                "(keras.Variable, with assign and numpy), read by the model."
            )
        checked[name] = variable
    return checked


class Tunables:
    """What ``set`` may change in one model's `fit`.

    Args:
        model: The compiled model being trained.
        user: Names to Keras variables the user exposes (see
            `check_user_tunables`).
        rebuild: Retraces the model's train function (at its next call),
            after a change the traced step holds as a constant. Defaults to
            ``model.make_train_function(force=True)``.
        custom_step: The step is the user's own (a custom loop) and cannot
            be retraced: only what lives in variables is offered (the
            learning rate, unless it is a schedule, and the user's
            tunables). Defaults to False.
    """

    def __init__(self, model, user: Mapping[str, Any] | None = None, rebuild: Callable[[], None] | None = None, *,
                 custom_step: bool = False):
        self.model = model
        self.user = check_user_tunables(user)
        self.custom_step = custom_step
        self._rebuild = rebuild or (lambda: model.make_train_function(force=True))
        self._schedule: Any = None  # the schedule a constant replaced, while it is replaced

    @property
    def optimizer(self):
        """The optimizer that does the update: under a wrapper (Keras's
        `LossScaleOptimizer`, which mixed precision adds), the inner one."""
        optimizer = getattr(self.model, "optimizer", None)
        while getattr(optimizer, "inner_optimizer", None) is not None:
            optimizer = optimizer.inner_optimizer
        return optimizer

    @property
    def schedule_replaced(self) -> bool:
        """True once ``set learning_rate`` replaced the optimizer's schedule."""
        return self._schedule is not None

    def names(self) -> list[str]:
        """What this run can set: the optimizer's hyperparameters it has, then the user's."""
        optimizer = self.optimizer
        names = []
        if optimizer is not None and not self.custom_step:
            names = [name for name in OPTIMIZER_HYPERPARAMETERS if name == "learning_rate" or hasattr(optimizer, name)]
        elif optimizer is not None and self._lr_is_variable():
            names = ["learning_rate"]  # a custom loop's step reads the variable; the rest are its constants
        return names + sorted(self.user)

    @property
    def read_anywhere(self) -> bool:
        """True where the values may be read on any thread while the training
        thread trains: torch's tensors. False on JAX, whose trainer empties
        the model's variables while an epoch runs and fills them at
        boundaries, and on TensorFlow (Keras 2 too): a read on another
        thread has TensorFlow build that thread a graph of its own, and a
        run's thread doing so was seen to hang for good (twice in three full
        test runs, 2026-12-05). There the read belongs to the training thread."""
        if _is_keras2(self.optimizer):
            return False
        import keras

        return keras.backend.backend() == "torch"

    def _lr_is_variable(self) -> bool:
        return _is_variable(getattr(self.optimizer, "_learning_rate", None))

    def read(self, names: list[str] | None = None) -> dict[str, float | None]:
        """The current values (None: a hyperparameter that is off, like ``clipnorm``)."""
        return {name: self._read(name) for name in (self.names() if names is None else names)}

    def _read(self, name: str) -> float | None:
        if name in self.user:
            return _number(self.user[name])
        if name == "learning_rate":
            return _number(self.optimizer.learning_rate)
        value = getattr(self.optimizer, name, None)
        return None if value is None else _number(value)

    def describe(self) -> str:
        """What can be set, for messages: ``learning_rate, beta_1, ..., dropout``."""
        aliases = {canonical: alias for alias, canonical in TUNABLE_ALIASES.items()}
        names = [f"{name} ({aliases[name]})" if name in aliases else name for name in self.names()]
        return ", ".join(names) or "nothing (the model has no optimizer and no tunables were given)"

    def check(self, changes: Mapping[str, float]) -> None:
        """Checks a whole change against this optimizer and the values' ranges.

        Raises:
            TunableError: Saying what is wrong and what can be set.
        """
        known = self.names()
        unknown = [name for name in changes if name not in known]
        if "learning_rate" in unknown and self.custom_step and self.optimizer is not None:
            schedule = type(getattr(self.optimizer, "_learning_rate", None)).__name__
            raise TunableError(
                f"Cannot set learning_rate: {type(self.optimizer).__name__}'s learning rate is a schedule ({schedule}), "
                "which a custom loop's step calls itself; give the optimizer a number to steer it. "
                f"Can set: {self.describe()}."
            )
        if unknown and self.custom_step and unknown[0] in OPTIMIZER_HYPERPARAMETERS:
            raise TunableError(
                f"Cannot set {', '.join(unknown)}: in a custom loop a traced step holds it as a constant, which only a "
                f"retrace would change; only values kept in variables change live. Can set: {self.describe()}."
            )
        if unknown:
            what = "an optimizer hyperparameter" if unknown[0] in OPTIMIZER_HYPERPARAMETERS else "a name"
            optimizer = type(self.optimizer).__name__ if self.optimizer is not None else "this model"
            raise TunableError(
                f"Cannot set {', '.join(unknown)}: not {what} {optimizer} has. Can set: {self.describe()}."
            )
        for name, value in changes.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise TunableError(f"{name} must be a finite number, got {value!r}.")
            problem = self._range_problem(name, float(value))
            if problem:
                raise TunableError(f"{name}={value!r}: {problem}.")
        clippers = [name for name in _CLIPPERS if name in changes or getattr(self.optimizer, name, None) is not None]
        if self.optimizer is not None and len(clippers) > 1:
            raise TunableError(
                f"Cannot set {' and '.join(clippers)} together: Keras clips by one of clipnorm, clipvalue, global_clipnorm."
            )

    def _range_problem(self, name: str, value: float) -> str | None:
        if name in self.user:
            dtype = str(getattr(self.user[name], "dtype", ""))
            if ("int" in dtype or "bool" in dtype) and value != int(value):
                return f"the variable holds whole numbers ({dtype})"
            return None
        if name in ("learning_rate", "weight_decay") and value < 0:
            return "expected a number of at least 0"
        if name == "momentum" and not 0 <= value <= 1:
            return "expected a number from 0 to 1"
        if name == "momentum" and value != 0 and not getattr(self.optimizer, "momentum", 0) \
                and getattr(self.optimizer, "built", False):
            # SGD and RMSprop make their momentum slots only when built with one (Keras 3; Keras 2's always do).
            return (f"{type(self.optimizer).__name__} was built without momentum, so it has no momentum state; "
                    "compile it with a momentum above 0 to steer it")
        if name in ("beta_1", "beta_2") and not 0 <= value < 1:
            return "expected a number from 0 to below 1"
        if name in ("clipnorm", "clipvalue") and value <= 0:
            return "expected a number above 0"
        return None

    def apply(self, changes: Mapping[str, float]) -> list[Change]:
        """Checks, then makes, a change; all of it or none.

        Call on the training thread between two batches, the model's state
        up to date.

        Returns:
            What changed: the old values as read, the new ones as given (the
            variable may hold them rounded to its dtype). A value set to what
            it was is listed too.

        Raises:
            TunableError: If `check` refuses it (nothing changed).
        """
        self.check(changes)
        old = self.read(list(changes))
        rebuild = False
        for name, value in changes.items():
            rebuild |= self._write(name, float(value))
        if rebuild:
            self._rebuild()
        return [Change(name, old[name], float(value)) for name, value in changes.items()]

    def restore(self, values: Mapping[str, float]) -> None:
        """Writes back values `read` returned (after a rollback loaded older
        ones), without checks; ignores names this run does not have."""
        known = set(self.names())
        wanted = {name: value for name, value in values.items() if name in known and value is not None}
        if any(self._read(name) != value for name, value in wanted.items()):
            self.apply(wanted)

    def _write(self, name: str, value: float) -> bool:
        """Sets one value; True if the train function must be rebuilt."""
        if name in self.user:
            self.user[name].assign(value)
            return False
        optimizer = self.optimizer
        if name == "learning_rate":
            import keras

            current = optimizer._learning_rate
            if _is_variable(current):
                current.assign(value)
                # An untracked constant (see `_replace_schedule`) is not part
                # of JAX's traced state: JAX needs a retrace to see it.
                return self.schedule_replaced and keras.backend.backend() == "jax"
            self._replace_schedule(value)
            return True
        setattr(optimizer, name, value)
        return True

    def _replace_schedule(self, value: float) -> None:
        import keras

        optimizer = self.optimizer
        self._schedule = optimizer._learning_rate
        # Not tracked by the optimizer (Keras's __setattr__ would track it):
        # its variables, and so its checkpoints, stay those of the optimizer
        # the user built (see `as_built`).
        if _is_keras2(optimizer):  # Keras 2: its step reads a TensorFlow variable
            import tensorflow as tf

            constant = tf.Variable(value, name="learning_rate", dtype=self._schedule_dtype(), trainable=False)
        else:
            constant = keras.Variable(value, name="learning_rate", dtype=keras.backend.floatx(), trainable=False)
        object.__setattr__(optimizer, "_learning_rate", constant)

    def _schedule_dtype(self):
        """The dtype of a Keras 2 optimizer's current learning rate (its schedule's)."""
        current = getattr(self.optimizer, "_current_learning_rate", None)
        return getattr(current, "dtype", None) or "float32"

    @contextlib.contextmanager
    def as_built(self) -> Iterator[None]:
        """While saving: the optimizer has its schedule back, so the saved
        model's config matches its variables (`keras.models.load_model` of
        the checkpoint gets the optimizer's state). The sidecar records the
        constant; resume applies it again."""
        schedule = self._schedule
        if schedule is None:
            yield
            return
        optimizer = self.optimizer
        constant = optimizer._learning_rate
        object.__setattr__(optimizer, "_learning_rate", schedule)
        try:
            yield
        finally:
            object.__setattr__(optimizer, "_learning_rate", constant)


def _is_keras2(optimizer) -> bool:
    """True for a Keras 2 (``tf_keras``) optimizer."""
    return type(optimizer).__module__.startswith("tf_keras.")


def _is_variable(value: Any) -> bool:
    """True for a variable a traced step reads (a Keras one, or Keras 2's
    TensorFlow variable); False for a schedule or any other callable."""
    return value is not None and callable(getattr(value, "assign", None)) and not callable(value)


def _number(value: Any) -> float:
    """`value` as a float: a plain number as it is, a TensorFlow variable
    (a Keras 3 one's ``value``, or Keras 2's own) by one read of it, any
    other variable or tensor by its own ``numpy()``. This runs at every
    `fit`'s start and every epoch's end: a TensorFlow variable's ``numpy()``
    reads it and copies the read (two eager ops, 0.18-0.31 ms right after
    the steps ran, against 0.09-0.20 ms for the read alone, its
    ``value()``), and `convert_to_numpy` converts to a tensor first."""
    if isinstance(value, (int, float)):
        return float(value)
    inner = getattr(value, "value", None)  # Keras 2's tf.Variable: its read; a Keras 3 variable: the backend's
    read = inner if callable(inner) else getattr(inner, "value", None)
    if callable(read):
        value = read()
    numpy = getattr(value, "numpy", None)
    if callable(numpy):
        return float(numpy())
    import keras

    return float(keras.ops.convert_to_numpy(value))
