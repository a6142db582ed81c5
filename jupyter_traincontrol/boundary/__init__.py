"""What commands do to a training at a boundary, whatever drives it (`fit`, a loop).

- `port`: what this layer needs of a run (`RunPort`) and of the state
  being trained (`Trained`).
- `progress`: `TrainingProgress`, the driver's counters, read by the run.
- `actions`: `CommandActions`, each command at a boundary, acknowledged.
- `saves`: `SaveScheduler`, checkpoints that hold training only for a copy.
- `steering`: ``set`` and ``rollback``, and the record of what changed.
- `tunables`: what ``set`` may change in a Keras optimizer and model.
- `nan_policy`: what a non-finite loss does.
- `safeguards`: Ctrl+C, SIGTERM and autosave for the life of a training.
- `session`: `TrainingSession`, the one training session of every driver
  (`fit`, Keras 2's `fit`, `TrainLoop`), each a thin `Driver` adapter.
"""
