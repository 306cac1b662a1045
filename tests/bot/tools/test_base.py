"""bot.tools.base: the names a tool may have."""

from __future__ import annotations

import re

import pytest

from bot.tools.base import check_tool_name

# The model APIs' rule, as they write it; ``\Z`` so that a final newline is no end.
_API_RULE = re.compile(r"[a-zA-Z0-9_-]{1,64}\Z")

NAMES = [
    "restart",
    "restart_service-2",
    "A" * 64,
    "A" * 65,
    "",
    "-",
    "_",
    "restart\n",
    "\nrestart",
    "re start",
    "restart.now",
    "srv__tool",
    "caf\u00e9",  # a letter, not an ASCII one
    "\u0661\u0662",  # Arabic-Indic digits: digits, not ASCII ones
    "\uff41",  # a fullwidth a
    "\u212a",  # the Kelvin sign, which folds to k
    "a\x00",
]


@pytest.mark.parametrize("name", NAMES)
def test_a_name_is_taken_exactly_when_the_model_apis_take_it(name: str) -> None:
    if _API_RULE.match(name):
        check_tool_name(name)
        return
    with pytest.raises(ValueError, match="a tool's name is 1 to 64 letters, digits, _ and -"):
        check_tool_name(name)


def test_a_refusal_names_the_characters_or_the_length() -> None:
    with pytest.raises(ValueError, match="has 'é'"):
        check_tool_name("caf\u00e9")
    with pytest.raises(ValueError, match="has 65 characters"):
        check_tool_name("a" * 65)
