"""Every option of every `clasp` subcommand says what it does, and its default where it has one."""

from __future__ import annotations

import argparse

import pytest

from clasp.cli import build_parser
from clasp.cli.bench import _parser as bench_parser
from clasp.cli.place import _parser as place_parser
from clasp.cli.sim import _parser as simulate_parser

# `clasp place|simulate|bench` hand their arguments to parsers of their own.
DELEGATED = {"place": place_parser, "simulate": simulate_parser, "bench": bench_parser}


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command, parser) for `clasp` and each subcommand, the delegated ones by their own parsers."""
    top = build_parser()
    out = [("clasp", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((f"clasp {name}", DELEGATED[name]() if name in DELEGATED else sub))
    return out


def rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help as --help prints it (%(default)s and the like filled in)."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


def options():
    for command, parser in parsers():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield pytest.param(parser, action, id=f"{command} {'/'.join(action.option_strings) or action.dest}")


def test_every_subcommand_is_walked():
    names = {c for c, _ in parsers()}
    assert {"clasp planner", "clasp worker", "clasp cluster", "clasp run", "clasp drain", "clasp keys",
            "clasp place", "clasp simulate", "clasp bench"} <= names
    assert sum(1 for _ in options()) > 100


@pytest.mark.parametrize(("parser", "action"), list(options()))
def test_option_has_help_and_names_its_default(parser, action):
    text = rendered(parser, action)
    assert text.strip(), f"{parser.prog} {action.option_strings or action.dest}: no help"
    if isinstance(action, argparse._SubParsersAction):
        for choice in action._choices_actions:
            assert (choice.help or "").strip(), f"{parser.prog} {choice.dest}: no help"
        return
    if action.default is not None and action.default is not False and action.default is not argparse.SUPPRESS:
        # --x/--no-x names its default by the flag that gives it
        default = (action.option_strings[0 if action.default else 1]
                   if isinstance(action, argparse.BooleanOptionalAction) else str(action.default))
        assert default in text, (f"{parser.prog} {'/'.join(action.option_strings)}: the help does not name the "
                                 f"default {default!r}: {text!r}")
