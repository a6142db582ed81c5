"""Exact resume of a `fit`: where it continues, and the same data in the same order.

- `resumption`: loading the newest checkpoint, continuing at its epoch and batch.
- `batch_skipper`: the already-trained batches of the resumed epoch, drawn without training.
- `random_state`: the global random states and Keras seed generators a checkpoint keeps.
- `data_order`: what orders the data besides them, counted and replayed.
"""
