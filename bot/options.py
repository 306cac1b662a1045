"""A question's options: which one an answer picks, and why an answer picks none."""

from __future__ import annotations

from collections.abc import Sequence

from bot.people.refusal import Refusal

# Shorthands people type for a yes/no question's options.
_ALIASES = {"y": "yes", "n": "no"}


def match_option(answer: str, options: Sequence[str]) -> str | None:
    """The option ``answer`` picks, as the question spells it (any case; y/n for yes/no; its
    number, ``2`` or ``#2``, as a card numbers options, when no option holds a number)."""
    wanted = answer.strip().casefold()
    spelled = {option.strip().casefold(): option for option in options}
    if wanted in spelled:
        return spelled[wanted]
    alias = _ALIASES.get(wanted)
    if alias:
        return spelled.get(alias)
    return _numbered(wanted, options)


def _numbered(wanted: str, options: Sequence[str]) -> str | None:
    """The option whose number (from 1) ``wanted`` is. Never where an option holds a number:
    in ``2 replicas`` / ``4 replicas``, ``2`` may mean the count as well as the second option;
    nor for yes/no, whose two short options no card numbers (``1`` is no way to say yes)."""
    number = wanted.removeprefix("#").removesuffix(".")
    if not number.isdecimal() or any(_holds_number(option) for option in options):
        return None
    if {option.strip().casefold() for option in options} == {"yes", "no"}:
        return None
    index = int(number) - 1
    return options[index] if 0 <= index < len(options) else None


def _holds_number(option: str) -> bool:
    """Whether an option has a number in it, in any script (``3``, ``v2``, ``③``, ``٢``)."""
    return any(char.isnumeric() for char in option)


def wordless(answer: str) -> Refusal | None:
    """Why ``answer`` answers no question: it has no words (a file posted alone, a blank line)."""
    if answer.strip():
        return None
    return Refusal("an answer needs words: a reply with no text (a file alone) answers nothing")


def answer_refusal(answer: str, options: Sequence[str]) -> Refusal | None:
    """None when ``answer`` answers a question with these options (any, without); else why."""
    if not options or match_option(answer, options) is not None:
        return None
    return Refusal(f"{_quoted(answer)} is not one of the options: answer {_listed(options)}")


def _quoted(text: str, limit: int = 80) -> str:
    """Text in quotation marks for people: one line, cut when long."""
    flat = " ".join(text.split())
    return f"“{flat if len(flat) <= limit else flat[: limit - 1] + '…'}”"


def _listed(options: Sequence[str]) -> str:
    """``“yes” or “no”``; ``“eu”, “us” or “ap”``."""
    quoted = [_quoted(option) for option in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
