"""Custom training loops under control: `TrainLoop`, the same run as a `fit`'s, driven by the loop's own boundaries.

- `train_loop`: `TrainLoop`, a context manager with `epochs`, `batches` and `log`.
- `adapter`: `LoopAdapter`, a loop's side of its training session
  (`boundary.session.TrainingSession`): its boundaries, state and resume.
- `states`: what a loop's checkpoints hold (a Keras model, PyTorch state
  dicts, the user's own save and load), and what ``set`` may change.
- `stateless`: a loop that keeps its state outside the model (``sync=``):
  ``reload=``, or ``set`` and ``rollback`` refused.
- `data_sources`: what orders the items `batches` is given (a `tf.data`
  dataset's iterators, a ``DataLoader``'s generators), kept for a resume.
"""
