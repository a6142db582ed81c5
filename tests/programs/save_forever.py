"""Saves a Keras model of a given width again and again, until killed.

Usage: python save_forever.py FOLDER WIDTH. Prints READY before the first save.
"""

import sys
from jupyter_traincontrol.checkpoint import CheckpointStore, TrainingPosition
import keras
size = int(sys.argv[2])
model = keras.Sequential([keras.Input((size,)), keras.layers.Dense(size)])
model.compile("adam", "mse")
store = CheckpointStore(sys.argv[1], keep=2)
print("READY", flush=True)
step = 0
while True:
    step += 1
    store.save(model, TrainingPosition(epoch=0, step_in_epoch=step), reason="save")
