"""The protocol: pure vocabulary and formats, no I/O.

- `commands`: the command words, their help, the request grammar, a
  request as a line both ways (`LineDecoder`: a byte stream into requests),
  and who sent a request, in words.
- `states`: run states, which commands make sense in each, the transitions,
  and how a run ended (``end_reason``).
- `record`: the fields of a run record, for its writer and its readers.
- `values`: numbers as JSON carries them (NaN as null).

Every other layer builds on this one; it imports nothing of the package.
"""

from .commands import (COMMAND_HELP, COMMAND_NAMES, MAX_LINE_BYTES, MAX_ROLLBACK_DEPTH, TUNABLE_ALIASES, Command,
                       LineDecoder, Rejected, Request, UnknownCommandError, WAITED_ID_MARK, assignments, is_interrupt,
                       is_waited_id, parse_command, parse_request, rollback_depth, sender_words, shorten,
                       validate_tunable_name)
from .states import (ACTIVE_STATES, END_REASONS, FINAL_STATES, TRANSITIONS, InvalidTransitionError, RunState,
                     allowed_commands, as_state, end_reason, final_state, resume_hint)

__all__ = [
    "ACTIVE_STATES", "COMMAND_HELP", "COMMAND_NAMES", "Command", "END_REASONS", "FINAL_STATES",
    "InvalidTransitionError", "LineDecoder", "MAX_LINE_BYTES", "MAX_ROLLBACK_DEPTH", "Rejected", "Request",
    "RunState", "TRANSITIONS", "TUNABLE_ALIASES", "UnknownCommandError", "WAITED_ID_MARK", "allowed_commands",
    "as_state", "assignments", "end_reason", "final_state", "is_interrupt", "is_waited_id", "parse_command",
    "parse_request", "resume_hint", "rollback_depth", "sender_words", "shorten", "validate_tunable_name",
]
