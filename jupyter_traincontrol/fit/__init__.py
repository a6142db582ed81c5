"""Keras `fit` under control: `ControlCallback` and what one `fit` holds.

- `callback`: `ControlCallback`, the Keras hooks only.
- `adapter`: `FitAdapter`, a `fit`'s side of its training session
  (`boundary.session.TrainingSession`): its boundaries, state and resume.
- `span`: `FitSpan`, one run for every `fit` of a ``with ControlCallback(...)`` block.
- `watchdog`: notices a `fit` that raised (Keras then skips ``on_train_end``).
- `resume/`: exact resume (the batches already trained, random state, data order).
- `keras2`: what a Keras 2 (``tf_keras``) `fit` needs of the callback, its
  resume, and the one line saying what it cannot do.
"""
