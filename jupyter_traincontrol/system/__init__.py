"""OS primitives, standard library only: private files, ``flock``, chained
signal handlers, and where a call is on the stack.

- `private_fs`: private folders and files, atomic JSON, never through a symlink.
- `flock`: locks without waiting, and the lock file a process holds.
- `signals`: signal handlers installed in front of the previous ones, and restored.
- `sigint`: Ctrl+C in a script: the first press stops a run gracefully, the second raises.
- `frames`: finding a call on a thread's stack.
"""
