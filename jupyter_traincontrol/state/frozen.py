"""A variable's value as of now, kept without holding training: each backend's cheapest way.

A snapshot taken at a batch boundary must keep the values of that boundary
while training goes on, until its writer thread has written them. What
that costs the training thread depends on how the backend updates state:

- TensorFlow: a variable's buffer is copy-on-write. A read of it
  (``read_value``: no copy) is a tensor that later updates cannot change:
  the first update after it copies the buffer first, on the device, inside
  the step (that is what the snapshot costs training: one copy of each
  variable the step updates, made by the runtime; `freeze` itself is a
  few microseconds a variable).
- JAX: arrays are immutable; the trainer's next step donates its state's
  buffers to the new state. On the CPU a host view of an array (no copy)
  keeps its buffer alive, and XLA then gives the step fresh buffers
  instead of reusing it (the step allocates what donation would have
  saved). On an accelerator, a device-side copy (queued, not waited for:
  the device copies in device memory, at its own speed), which the writer
  thread brings to the host.
- torch (and anything else): variables are updated in place, so the value
  is copied: a CUDA tensor on its device (a queued copy, brought to the
  host by the writer thread on a stream of its own), else into host arrays
  the run reuses from one snapshot to the next (`copy_into`,
  `SnapshotBuffers`). On an H200, 1 GB copied to the host held training
  690-824 ms a save (torch 2.11, measured before the device copy).

`view` is the other case: a value read without a copy for a writer the
training thread waits for (a ``stop``'s checkpoint).

`Late` is the same for a number a checkpoint records (the optimizer's
step, its learning rate, a seed generator's state): on TensorFlow a host
read (``numpy()``) is 50 µs on the benchmark machine, the first eager op
after a pause 0.1-0.35 ms, against a few µs for the read `freeze` makes,
so the training thread keeps the frozen value and the writer thread
brings it to the host.

No checkpoint of bad weights is ever written or loaded: `is_finite` is the
one check of a host array, over any size, with a bounded temporary.

Keras and numpy are imported lazily.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["values_for_snapshot", "freeze", "view", "copy_into", "host_copy", "copies_in_place", "as_host_array",
           "torch_on_host", "nbytes_of", "is_finite", "Late", "MakeLate", "late_json"]

_FINITE_CHUNK = 1 << 22  # elements checked at a time: a bounded temporary, whatever the array's size


def copies_in_place() -> bool:
    """True where a snapshot must copy every variable (the backend updates
    them in place): torch, and backends not known here."""
    import keras

    return keras.backend.backend() not in ("tensorflow", "jax")


def values_for_snapshot(variables: list, *, copy: bool, kept: list | None) -> tuple[list, list]:
    """The values of Keras `variables` as of now, in order, each kept the way
    a snapshot needs, in one call for all of them.

    Args:
        variables: The Keras variables, in the order of the save walk.
        copy: False: views of their buffers (`view`, else a host copy), for
            a snapshot written while the training thread waits.
        kept: Host arrays of an earlier snapshot to copy into, in order
            (a shape or dtype that changed gets a new array); None: no
            buffers, each value is frozen the backend's way (`freeze`),
            copied where it cannot be.

    Returns:
        The values, and the host arrays among them that go into the kept
        buffers (in order: the next snapshot copies into them).
    """
    values, arrays = [], []
    in_place = kept is not None and copies_in_place()
    for variable in variables:
        if not copy:
            found = view(variable)
            values.append(found if found is not None else host_copy(variable))
            continue
        if kept is None or in_place:  # with buffers, only a backend updating in place freezes (a CUDA copy)
            found = freeze(variable)
            if found is not None:
                values.append(found)
                continue
        index = len(arrays)
        copied = copy_into(variable, kept[index] if kept is not None and index < len(kept) else None)
        if copied is None:
            values.append(host_copy(variable))
            continue
        arrays.append(copied)
        values.append(copied)
    return values, arrays


def freeze(variable) -> Any:
    """The value of a Keras variable now, which later training steps do not
    change, taken without a host copy where the backend allows (see the
    module's docstring); None where it does not (the caller copies)."""
    import keras

    backend = keras.backend.backend()
    value = variable.value
    if backend == "tensorflow":
        from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

        if isinstance(value, BaseResourceVariable) and type(value).read_value is BaseResourceVariable.read_value:
            import tensorflow as tf

            # The op itself (17 us; read_value() wraps it in 60 us more): copy-on-write, the buffer as of now.
            return tf.raw_ops.ReadVariableOp(resource=value.handle, dtype=value.dtype)
        return None  # a distributed variable: read through its own path, copied
    if backend == "jax":
        import jax

        if not isinstance(value, jax.Array) or value.is_deleted():
            return None
        devices = value.sharding.device_set
        if len(devices) == 1 and next(iter(devices)).platform == "cpu":
            import numpy as np

            return np.asarray(value)  # a view: the buffer is kept, not donated
        if value.is_fully_addressable:
            return value.copy()  # on the device, queued (the next step donates the original)
        return None
    if backend == "torch":
        import torch

        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value.detach().clone()  # on the device, queued on its stream
    return None


class Late:
    """What `convert` makes of a Keras variable's value as of its creation,
    made when `value` is first called (by a writer thread): the training
    thread only freezes the value (`freeze`). Where the backend keeps no
    such value (torch), it is read and converted at creation.

    Args:
        variable: The Keras variable.
        convert: Makes the recorded value of the host array (``int``, say).
    """

    __slots__ = ("_frozen", "_convert", "_value", "_done")

    def __init__(self, variable, convert: Callable[[Any], Any]):
        self._frozen, self._convert, self._value, self._done = freeze(variable), convert, None, False
        if self._frozen is None:
            import keras

            self._value, self._done = convert(keras.ops.convert_to_numpy(variable)), True

    @classmethod
    def of_frozen(cls, frozen: Any, convert: Callable[[Any], Any]) -> "Late":
        """What `convert` makes of `frozen` (a value `freeze` made, or a
        snapshot's host copy), made when `value` is first called: for a
        variable a snapshot froze already, no second read."""
        late = cls.__new__(cls)
        late._frozen, late._convert, late._value, late._done = frozen, convert, None, False
        return late

    def value(self) -> Any:
        """The converted value (a host read the first time, on the caller's thread)."""
        if not self._done:
            self._value, self._done = self._convert(as_host_array(self._frozen)), True
        return self._value


#: Makes the `Late` value of a Keras variable with a converter: `Late`
#: itself (a read now), or a snapshot's (`ModelSnapshot.late`: the value it took).
MakeLate = Callable[[Any, Callable[[Any], Any]], Late]


def late_json(value: Any) -> Any:
    """``json.dumps``'s ``default``: a `Late` value is written as its value.

    Raises:
        TypeError: For anything else, as ``json.dumps`` would.
    """
    if isinstance(value, Late):
        return value.value()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable; expected JSON values or Late.")


def view(variable) -> Any:
    """The value of a Keras variable as a numpy array, without a copy where
    the backend allows (CPU); None where there is no such view (another
    dtype than numpy's, a tensor on no host, an unknown backend). Valid
    only while the variable does not change."""
    import keras
    import numpy as np

    backend = keras.backend.backend()
    value = variable.value
    try:
        if backend == "torch":
            found = value.detach().cpu().numpy()  # shares the CPU tensor's memory
        elif backend == "tensorflow":
            from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

            if isinstance(value, BaseResourceVariable):  # not a distributed one: those read through their own path
                import tensorflow as tf

                value = tf.raw_ops.ReadVariableOp(resource=value.handle, dtype=value.dtype)  # shares the buffer
            found = np.asarray(value)  # a view of the tensor read on CPU
        elif backend in ("jax", "numpy"):
            found = np.asarray(value)  # a view of the buffer on CPU
        else:
            return None
    except (TypeError, ValueError, RuntimeError):  # bfloat16 and others numpy lacks
        return None
    if not isinstance(found, np.ndarray) or found.dtype == object or tuple(found.shape) != tuple(variable.shape):
        return None
    return found


def copy_into(variable, kept) -> Any:
    """A host copy of a Keras variable's value, into `kept` (an array of an
    earlier snapshot) when its shape and dtype match; None if the variable
    has no host view (the caller copies it another way)."""
    import numpy as np

    found = view(variable)
    if found is None:
        return None
    if kept is None or kept.shape != found.shape or kept.dtype != found.dtype:
        kept = np.empty(found.shape, found.dtype)
    np.copyto(kept, found)
    return kept


def host_copy(value: Any) -> Any:
    """A host copy of `value` that later training cannot change."""
    import keras
    import numpy as np

    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    fresh = isinstance(value, np.ndarray) or np.isscalar(value)  # read by the saveable itself (``.numpy()``)
    array = value if fresh else keras.ops.convert_to_numpy(value)
    if keras.backend.backend() == "tensorflow":
        return array  # a read of a TF variable is a copy already (copy-on-write buffers)
    return np.array(array, copy=True)  # torch and JAX reads may share the variable's buffer


def as_host_array(value: Any) -> Any:
    """A frozen value as a host numpy array (on the writer thread: a device
    value comes to the host here); other values as they are."""
    import numpy as np

    if isinstance(value, (np.ndarray, str, bytes, int, float, bool)) or value is None or np.isscalar(value):
        return value
    if hasattr(value, "detach"):  # a torch tensor
        return torch_on_host(value.detach()).numpy()
    return np.asarray(value)


def torch_on_host(tensor) -> Any:
    """A torch tensor on the host. From a CUDA device it is copied on a
    stream of its own, once the work queued so far on the device's current
    stream (where Keras queues training, and where `freeze` queued the
    copy) has run: the copy waits for the steps already queued, and later
    steps do not wait for it."""
    if tensor.device.type != "cuda":
        return tensor.cpu()
    import torch

    side = torch.cuda.Stream(device=tensor.device)
    side.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(side):
        return tensor.to("cpu")  # waits for the copy (on `side` only)


def nbytes_of(value: Any) -> int:
    """Bytes of array data in a frozen value (0 for plain values)."""
    import numpy as np

    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).itemsize
    except TypeError:
        itemsize = getattr(value, "element_size", lambda: 0)()
    count = 1
    for size in tuple(shape):
        count *= int(size)
    return count * itemsize


def is_finite(value: Any) -> bool:
    """False if `value` is a floating-point array holding a NaN or an infinity."""
    import numpy as np

    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fc":
        return True
    flat = value.reshape(-1)
    return all(np.isfinite(flat[start:start + _FINITE_CHUNK]).all() for start in range(0, flat.size, _FINITE_CHUNK))
