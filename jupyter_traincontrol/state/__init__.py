"""What a checkpoint holds, and how it is read and restored: a Keras model's state.

- `keras_state`: `KerasState`, a model as the boundary layer handles it,
  and the functions under it (syncing the variables, the optimizer's step,
  restoring a checkpoint, backups, a finiteness check).
- `snapshot`: `ModelSnapshot`, a host copy of what ``model.save`` writes,
  written as a ``.keras`` file later, on any thread.
- `keras2_state`: `Keras2State`, a Keras 2 (``tf_keras``) model, saved with
  its own ``model.save`` on the training thread.

Keras (and numpy) are imported lazily, inside the functions.
"""

from .keras_state import (KerasState, all_finite, assign_variables, copy_variables, non_finite_variables, optimizer_step,
                          restore_weights, sync_model_state)
from .keras2_state import Keras2State, is_keras2_model
from .snapshot import ModelSnapshot, SnapshotBuffers

__all__ = ["Keras2State", "KerasState", "ModelSnapshot", "SnapshotBuffers", "all_finite", "assign_variables",
           "copy_variables", "is_keras2_model", "non_finite_variables", "optimizer_step", "restore_weights",
           "sync_model_state"]
