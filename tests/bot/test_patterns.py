"""A pattern compiled on first use behaves as the compiled pattern, once it is used."""

from __future__ import annotations

import re

import pytest

from bot.patterns import finditer_with, on_use, on_use_written


def test_a_pattern_is_compiled_only_when_first_used() -> None:
    unbalanced = on_use(r"(")  # re.compile would raise here
    with pytest.raises(re.error):
        unbalanced.search("(")


@pytest.mark.parametrize("text", ["", "a=1 b=22", "no digits", "x=333=y"])
def test_every_method_answers_as_re_does(text: str) -> None:
    source, flags = r"(?P<key>[a-z])=(?P<value>[0-9]+)", re.IGNORECASE
    lazy, compiled = on_use(source, flags), re.compile(source, flags)
    assert [m.span() for m in lazy.finditer(text)] == [m.span() for m in compiled.finditer(text)]
    for method in ("search", "match", "fullmatch"):
        found, expected = getattr(lazy, method)(text), getattr(compiled, method)(text)
        assert (found and found.groupdict()) == (expected and expected.groupdict())
    assert lazy.findall(text) == compiled.findall(text)
    assert lazy.split(text) == compiled.split(text)
    assert lazy.sub("*", text) == compiled.sub("*", text)
    assert (lazy.pattern, lazy.flags, lazy.groups) == (source, compiled.flags, 2)


def test_bytes_patterns_too() -> None:
    lazy = on_use(rb"0{3}")
    assert [m.span() for m in lazy.finditer(b"a0000b000")] == [(1, 4), (6, 9)]


def test_a_text_without_the_literal_finds_nothing_and_compiles_nothing() -> None:
    unbalanced = on_use(r"k-(")  # it would raise if it were compiled
    assert list(finditer_with(unbalanced, "restart checkout", "k-", "k_")) == []


@pytest.mark.parametrize("text", ["sk-1 and rk_2", "only rk_2 here", "", "k"])
def test_a_text_with_a_literal_finds_what_the_pattern_finds(text: str) -> None:
    source = r"[sr]k[-_][0-9]"
    found = finditer_with(on_use(source), text, "k-", "k_")
    assert [m.span() for m in found] == [m.span() for m in re.finditer(source, text)]


def test_a_written_pattern_is_written_only_when_first_used() -> None:
    written: list[str] = []

    def write() -> str:
        written.append("once")
        return r"[0-9]+"

    lazy = on_use_written(write)
    assert written == []  # built with its module, used by no text yet
    assert [m.span() for m in lazy.finditer("a12b345")] == [(1, 3), (4, 7)]
    assert lazy.search("x9") is not None
    assert written == ["once"]


def test_a_written_pattern_unused_by_a_text_without_its_literal_is_never_written() -> None:
    def write() -> bytes:
        raise AssertionError("written for a text that cannot hold a match")

    assert list(finditer_with(on_use_written(write), b"restarted checkout", b"0-0")) == []
