"""bot.plain: one conversion, and every problem of a value that is not the type, each placed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import pytest
from msgspec import Meta

from bot.plain import FieldProblem, Invalid, Problem, convert, dotted, run_field_checks


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    count: Annotated[int, Meta(ge=1)] = 3
    salt: str | None = None

    def __post_init__(self) -> None:
        if self.salt is not None and len(self.salt) < 4:
            raise FieldProblem("salt", "a salt must be at least 4 characters")


class Outer(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    inner: Inner = msgspec.field(default_factory=Inner)
    items: list[Inner] = []
    mode: Literal["fast", "slow"] = "fast"
    limits: dict[str, Annotated[float, Meta(gt=0)]] = {}
    words: list[Annotated[str, Meta(pattern="^[a-z]+$")]] = []


def found(value: object) -> list[Problem]:
    with pytest.raises(Invalid) as caught:
        convert(value, Outer)
    return caught.value.problems


def test_a_valid_value_converts() -> None:
    made = convert({"name": "x", "items": [{"count": 2}], "limits": {"a": 1}}, Outer)
    assert made == Outer(name="x", items=[Inner(count=2)], limits={"a": 1.0})


def test_every_problem_is_reported_at_its_place() -> None:
    value = {
        "nmae": "x",
        "inner": {"count": 0},
        "items": [{}, {"extra": 1, "count": "2"}],
        "mode": "medium",
        "limits": {"ok": 1, "bad": -1},
        "words": ["fine", "NOT"],
    }
    assert found(value) == [
        Problem(("nmae",), "unknown key (did you mean name?)"),
        Problem(("name",), "required key is missing"),
        Problem(("inner", "count"), "must be an integer >= 1"),
        Problem(("items", 1, "extra"), "unknown key"),
        Problem(("items", 1, "count"), "expected an integer, got a string"),
        Problem(("mode",), "'medium' is not one of fast, slow"),
        Problem(("limits", "bad"), "must be a number > 0.0"),
        Problem(("words", 1), "must be a string matching regex '^[a-z]+$'"),
    ]


def test_a_structs_own_check_is_placed_at_the_field_it_names() -> None:
    assert found({"name": "x", "items": [{"salt": "ab"}]}) == [
        Problem(("items", 0, "salt"), "a salt must be at least 4 characters")
    ]


def test_a_wrong_shape_is_one_problem_at_its_place() -> None:
    assert found({"name": "x", "items": "no"}) == [
        Problem(("items",), "expected a list, got a string")
    ]
    assert found([]) == [Problem((), "expected a mapping, got a list")]


def test_one_word_where_a_list_of_words_goes_is_shown_as_that_list() -> None:
    # A list of structs gets no such hint: ["no"] would be as wrong as "no".
    assert found({"name": "x", "words": "fine"}) == [
        Problem(("words",), 'expected a list, got a string: write it as a list, ["fine"]')
    ]


def test_one_entry_where_a_list_of_entries_goes_says_to_make_it_an_item() -> None:
    # One schedule, server or tool written as the mapping itself, not as a list of one.
    assert found({"name": "x", "items": {"count": 2}}) == [
        Problem(
            ("items",),
            "expected a list, got a mapping: write it as a list of one, with - before its first"
            " key and its other keys under that one",
        )
    ]


def test_text_converts_to_numbers_only_when_not_strict() -> None:
    assert convert({"name": "x", "inner": {"count": "5"}}, Outer, strict=False).inner.count == 5
    with pytest.raises(Invalid, match=r"inner.count: expected an integer, got a string"):
        convert({"name": "x", "inner": {"count": "5"}}, Outer)


def test_places_read_as_a_document_names_them() -> None:
    assert dotted(("tools", 2, "timeout")) == "tools[2].timeout"
    assert dotted(()) == ""


class Counted(msgspec.Struct):
    digits: Annotated[str, Meta(pattern=r"^\d+\Z")]


def test_a_pattern_is_shown_as_written() -> None:
    with pytest.raises(Invalid) as caught:
        convert({"digits": "12\n"}, Counted)
    assert caught.value.problems == [
        Problem(("digits",), r"must be a string matching regex '^\d+\Z'")
    ]


class Keyed(msgspec.Struct):
    by_name: dict[str, int] = {}
    note: str | None = None


def test_a_key_of_the_wrong_type_is_placed_at_that_key() -> None:
    with pytest.raises(Invalid) as caught:
        convert({"by_name": {"a": 1, 7: 2}}, Keyed)
    assert caught.value.problems == [
        Problem(("by_name", "7"), "expected a string, got an integer (for a key)")
    ]


def test_a_union_with_null_is_said_in_words() -> None:
    with pytest.raises(Invalid) as caught:
        convert({"note": 5}, Keyed)
    assert caught.value.problems == [
        Problem(("note",), "expected a string or null, got an integer")
    ]


def slow_ok(value: str) -> None:
    if value != "ok":
        raise ValueError(f"{value!r} is not ok")


class Checked(msgspec.Struct, forbid_unknown_fields=True):
    """A field with a check of its own, run whatever else is wrong with the struct."""

    __field_checks__: ClassVar[dict[str, Callable[[Any], None]]] = {"word": slow_ok}

    word: str
    count: int

    def __post_init__(self) -> None:
        run_field_checks(self)


def test_a_fields_own_check_is_reported_beside_other_problems() -> None:
    with pytest.raises(Invalid) as caught:
        convert({"word": "bad", "count": "x", "extra": 1}, Checked)
    assert caught.value.problems == [
        Problem(("extra",), "unknown key"),
        Problem(("word",), "'bad' is not ok"),
        Problem(("count",), "expected an integer, got a string"),
    ]
    with pytest.raises(Invalid) as caught:
        convert({"word": "bad", "count": 1}, Checked)
    assert caught.value.problems == [Problem(("word",), "'bad' is not ok")]
    assert convert({"word": "ok", "count": 1}, Checked) == Checked(word="ok", count=1)
