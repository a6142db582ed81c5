"""How a command line crosses processes: the receiving channel, and the one sender.

- `receiver`: the queue that `read` fills (the base of both kinds); the
  channel only reads, on the thread its run gives it (`run.run_thread`).
- `fifo`, `spool`: a FIFO, or a spool folder where there are no FIFOs.
- `channels`: a run's channel from the outside: where each kind lives in a
  run folder, opening a run's, and `deliver`, the function every sender
  writes a command with.
"""
