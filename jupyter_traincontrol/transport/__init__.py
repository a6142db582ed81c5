"""How a command line crosses processes: the receiving channel, and the one sender.

- `receiver`: the queue a daemon reader thread fills (the base of both kinds).
- `fifo`, `spool`: a FIFO, or a spool folder where there are no FIFOs.
- `channels`: opening a run's channel; where to write to the run of a record.
- `send`: `deliver`, the function every sender writes a command with.
"""
