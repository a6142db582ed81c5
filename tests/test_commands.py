"""The command vocabulary and the line decoder (pure, no I/O)."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_traincontrol.protocol import (
    ACTIVE_STATES,
    COMMAND_HELP,
    COMMAND_NAMES,
    FINAL_STATES,
    Command,
    LineDecoder,
    Rejected,
    Request,
    RunState,
    UnknownCommandError,
    allowed_commands,
    parse_command,
    parse_request,
)


def test_vocabulary_is_exactly_the_seven_commands():
    assert COMMAND_NAMES == ("stop", "save", "abort", "pause", "resume", "set", "rollback")


@pytest.mark.parametrize("text", ["stop", " STOP\n", "Stop\r\n", "\tstop "])
def test_parse_ignores_case_and_surrounding_whitespace(text):
    assert parse_command(text) is Command.STOP


def test_unknown_command_names_what_was_received_and_what_is_expected():
    with pytest.raises(UnknownCommandError) as info:
        parse_command("frobnicate")
    assert str(info.value) == (
        "Unknown command 'frobnicate'. Expected one of: stop, save, abort, pause, resume, set, rollback."
    )


def test_non_text_is_rejected_with_its_type():
    with pytest.raises(UnknownCommandError, match="got int"):
        parse_command(3)


def test_decoder_joins_a_line_split_across_writes():
    decoder = LineDecoder()
    assert decoder.feed(b"sa") == []
    assert decoder.feed(b"v") == []
    assert decoder.feed(b"e\npause\nres") == [Request(Command.SAVE), Request(Command.PAUSE)]
    assert decoder.feed(b"ume\n") == [Request(Command.RESUME)]


def test_decoder_skips_blank_lines_and_reports_garbage_then_goes_on():
    decoder = LineDecoder()
    results = decoder.feed(b"\n\nhello\nstop\n")
    assert results[0] == Rejected(
        text="hello", reason="Unknown command 'hello'. Expected one of: stop, save, abort, pause, resume, set, rollback."
    )
    assert results[1:] == [Request(Command.STOP)]


def test_invalid_utf8_is_rejected_and_printable():
    (rejected, command) = LineDecoder().feed(b"\xff\xfe\x00sto\n" + b"abort\n")
    assert isinstance(rejected, Rejected) and "not valid UTF-8" in rejected.reason
    assert rejected.text.isprintable()
    assert command == Request(Command.ABORT)


def test_random_bytes_never_raise_and_later_commands_still_work():
    decoder = LineDecoder()
    rng_bytes = os.urandom(200_000)
    results = decoder.feed(rng_bytes) + decoder.feed(b"\nsave\n")
    assert results[-1] == Request(Command.SAVE)
    # Random bytes may, rarely, contain a command word on a line of its own;
    # everything else must come out as a rejection, never as an exception.
    assert all(isinstance(r, (Rejected, Request)) for r in results)


def test_a_one_mebibyte_line_is_rejected_whole_without_being_buffered():
    decoder = LineDecoder()
    results = []
    for _ in range(16):
        results += decoder.feed(b"x" * 65536)
        assert len(decoder._pending) <= 256
    results += decoder.feed(b"\nstop\n")
    assert len(results) == 2
    assert isinstance(results[0], Rejected) and "1048576 bytes is too long" in results[0].reason
    assert results[1] == Request(Command.STOP)


def test_a_remnant_from_a_dead_writer_does_not_swallow_the_next_command():
    decoder = LineDecoder()
    assert decoder.feed(b"sto") == []  # a writer died after three bytes
    rejected, command = decoder.feed(b"save\n")  # a healthy writer's whole line
    assert isinstance(rejected, Rejected) and rejected.text == "sto"
    assert "writer stopped mid-line" in rejected.reason
    assert command == Request(Command.SAVE)


def test_flush_decodes_a_last_line_without_newline():
    decoder = LineDecoder()
    assert decoder.feed(b"abort") == []
    assert decoder.flush() == [Request(Command.ABORT)]


def test_wire_format_is_one_ascii_line():
    assert Command.PAUSE.encode_line() == b"pause\n"


def test_a_request_may_carry_an_id_that_round_trips():
    request = parse_request("Save #a1-B_2")
    assert request == Request(Command.SAVE, (), "a1-B_2")
    assert request.encode_line() == b"save #a1-B_2\n"
    assert LineDecoder().feed(request.encode_line()) == [request]
    assert str(request) == "save"


@pytest.mark.parametrize(
    "line, message",
    [
        ("stop now", "'stop' takes no arguments, got 'now'"),
        ("stop #", "Invalid request id ''"),
        ("stop #" + "x" * 40, "Invalid request id"),
        ("#abc", "A request id without a command"),
        ("", "Empty command"),
        ("x" * 500, "Unknown command 'xxxxxxxx"),
    ],
)
def test_malformed_requests_are_clear_errors(line, message):
    with pytest.raises(UnknownCommandError, match=message) as caught:
        parse_request(line)
    assert len(str(caught.value)) < 200  # user input is quoted shortened


def test_one_help_table_and_states_that_say_what_applies():
    assert set(COMMAND_HELP) == set(Command)
    assert ACTIVE_STATES | FINAL_STATES == set(RunState) and not ACTIVE_STATES & FINAL_STATES
    assert allowed_commands("running") == (
        Command.SAVE, Command.STOP, Command.ABORT, Command.PAUSE, Command.SET, Command.ROLLBACK
    )
    assert allowed_commands(RunState.PAUSED) == (
        Command.SAVE, Command.STOP, Command.ABORT, Command.RESUME, Command.SET, Command.ROLLBACK
    )
    assert allowed_commands("stopping") == (Command.ABORT,)  # a second interrupt while stopping aborts
    assert allowed_commands("finished") == () and allowed_commands("no such state") == ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.sampled_from(COMMAND_NAMES), max_size=5))
def test_any_bytes_in_any_chunks_never_raise_and_whole_commands_after_them_arrive(chunks, words):
    decoder = LineDecoder()
    results = [result for chunk in chunks for result in decoder.feed(chunk)]
    results += decoder.feed(b"\n" + b"".join(f"{word}\n".encode() for word in words))
    assert all(isinstance(result, (Request, Rejected)) for result in results)
    tail = [r.command.value for r in results[len(results) - len(words):]] if words else []
    assert tail == list(words)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("set", Request(Command.SET)),
        ("SET lr=1e-4 #a1", Request(Command.SET, ("learning_rate=0.0001",), "a1")),
        ("set learning_rate=.5 beta_1=0.8 dropout=0", Request(Command.SET, ("learning_rate=0.5", "beta_1=0.8", "dropout=0.0"))),
        ("rollback", Request(Command.ROLLBACK)),
        ("rollback 3 #x", Request(Command.ROLLBACK, ("3",), "x")),
        ("rollback 007", Request(Command.ROLLBACK, ("7",))),
    ],
)
def test_set_and_rollback_arguments_are_parsed_and_made_canonical(line, expected):
    assert parse_request(line) == expected
    assert parse_request(expected.encode_line().decode().rstrip("\n")) == expected  # round trip


@pytest.mark.parametrize(
    "line, message",
    [
        ("set lr", "'set' takes KEY=VALUE pairs (set lr=1e-4), got 'lr'."),
        ("set =1", "'set' takes KEY=VALUE pairs (set lr=1e-4), got '=1'."),
        ("set lr=nan", "'set learning_rate=' takes a finite number (like 0.001 or 1e-4), got 'nan'."),
        ("set lr=1e400", "'set learning_rate=' takes a finite number (like 0.001 or 1e-4), got '1e400'."),
        ("set lr=1 learning_rate=2", "'set' got 'learning_rate' twice; give each name once."),
        ("set a-b=1", "Invalid name 'a-b': expected 1-64 letters, digits or '_', not starting with a digit."),
        ("rollback 0", "'rollback' takes one optional number N from 1 (the newest checkpoint) to 1000, got '0'."),
        ("rollback \u0662", "'rollback' takes one optional number N from 1 (the newest checkpoint) to 1000, got '\u0662'."),
        ("rollback 1 2", "'rollback' takes one optional number N from 1 (the newest checkpoint) to 1000, got '1 2'."),
    ],
)
def test_set_and_rollback_refuse_bad_arguments_saying_what_is_expected(line, message):
    with pytest.raises(UnknownCommandError) as info:
        parse_request(line)
    assert str(info.value) == message


def test_every_command_has_help_and_set_rollback_act_while_running_or_paused():
    assert set(COMMAND_HELP) == set(Command)
    for state in (RunState.RUNNING, RunState.PAUSED):
        assert {Command.SET, Command.ROLLBACK} <= set(allowed_commands(state))
    assert Command.SET not in allowed_commands(RunState.STOPPING)
