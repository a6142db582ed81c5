"""Writes commands to a run's FIFO once told to go (a line on stdin).

Usage: python write_commands.py FIFO WORD,WORD,...
"""

import sys
from jupyter_traincontrol.transport.channels import deliver
fifo, words = sys.argv[1], sys.argv[2].split(",")
sys.stdin.readline()  # the start signal: all writers go at once
for word in words:
    deliver(fifo, word)
