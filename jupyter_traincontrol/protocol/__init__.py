"""The protocol: pure vocabulary and formats, no I/O.

- `commands`: the command words, their help, and the request grammar.
- `states`: run states, which commands make sense in each, the transitions.
- `framing`: a byte stream into request lines.
- `record`: the fields of a run record, for its writer and its readers.
- `values`: numbers as JSON carries them (NaN as null).
- `endings`: who sent a request, in words; how a run ended (``end_reason``).

Every other layer builds on this one; it imports nothing of the package.
"""

from .commands import (COMMAND_HELP, COMMAND_NAMES, MAX_ROLLBACK_DEPTH, TUNABLE_ALIASES, Command, Request,
                       UnknownCommandError, WAITED_ID_MARK, assignments, is_waited_id, parse_command, parse_request,
                       rollback_depth, shorten, validate_tunable_name)
from .endings import END_REASONS, end_reason, is_interrupt, resume_hint, sender_words
from .framing import MAX_LINE_BYTES, LineDecoder, Rejected
from .states import (ACTIVE_STATES, FINAL_STATES, TRANSITIONS, InvalidTransitionError, RunState, allowed_commands,
                     as_state, final_state)

__all__ = [
    "ACTIVE_STATES", "COMMAND_HELP", "COMMAND_NAMES", "Command", "END_REASONS", "FINAL_STATES",
    "InvalidTransitionError", "LineDecoder", "MAX_LINE_BYTES", "MAX_ROLLBACK_DEPTH", "Rejected", "Request",
    "RunState", "TRANSITIONS", "TUNABLE_ALIASES", "UnknownCommandError", "WAITED_ID_MARK", "allowed_commands",
    "as_state", "assignments", "end_reason", "final_state", "is_interrupt", "is_waited_id", "parse_command",
    "parse_request", "resume_hint", "rollback_depth", "sender_words", "shorten", "validate_tunable_name",
]
