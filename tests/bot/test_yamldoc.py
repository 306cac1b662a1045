"""A YAML document read by libyaml when it can be: the values, lines and errors PyYAML's own
parser gives."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.yamldoc import NotYaml, node_and_value, safe_load
from tests.fakes.processes import fresh_python

DOCUMENTS = [
    "",
    "# nothing\n",
    "database: kestrel.db\nmodel: {provider: scripted, script: script.yaml}\ntools: [a.yaml]\n",
    "pii:\n  mode: off\nprovenance: no\nwhen: 2026-12-04\nratio: 1e3\nport: 0o17\nempty:\n",
    "- &one {name: a, n: 1}\n- *one\n- [1, 2.5, .inf, ~, 'x', \"\\u00e9\"]\n",
    "key: |\n  two\n  lines\nfolded: >\n  one\n  line\n",
    # A byte order mark after blank lines: libyaml skips it, PyYAML keeps it in the key.
    "\n\ufeffdatabase: kestrel.db\n",
]
# Each of PyYAML's kinds of error, by what is wrong.
BROKEN = {
    "a flow sequence left open": "a: [1, 2\n",
    "a mapping inside a plain value": "a: b: c\n",
    "a mapping after a sequence": "- a\nb: c\n",
    "a tab for indentation": "a:\n\t- b\n",
    "an unhashable key": "{a: 1, [b]: 2}\n",
    "an alias to no anchor": "a: *nowhere\n",
    "a tag safe_load refuses": "a: !!python/object:os.system x\n",
    # libyaml reads past the tab, and the constructor fails on the empty scalar.
    "a tab after an int's tag": "port: !!int \t\n",
    "a tab after a timestamp's tag": "when: !!timestamp \t\n",
    "a tab after an int's tag and a value": "port: !!int \tabc\n",
    "a character no YAML text may hold": "a: \udcff\n",
}
# PyYAML keeps the last of a repeated key; Kestrel's documents refuse it, with both lines.
REPEATED = {
    "a top-level key": ("a: 1\nb: 2\na: 3\n", 3, "duplicate key 'a', first at line 1"),
    "a key in a list's mapping": ("- {x: 1}\n- x: 1\n  x: 2\n", 3, "'x', first at line 2"),
    "a key below an alias": ("d: &m {k: 1, k: 2}\ne: *m\n", 1, "'k', first at line 1"),
}


@pytest.mark.parametrize("text", DOCUMENTS)
def test_a_document_reads_as_pyyaml_reads_it(text: str) -> None:
    assert safe_load(text) == yaml.safe_load(text)


@pytest.mark.parametrize("what", REPEATED)
def test_a_key_written_twice_is_refused_at_its_second_line(what: str) -> None:
    text, line, said = REPEATED[what]
    with pytest.raises(NotYaml) as refused:
        safe_load(text)
    assert refused.value.located("k.yaml").startswith(f"k.yaml:{line}: not valid YAML (")
    assert said in refused.value.located("k.yaml")


@pytest.mark.parametrize("text", DOCUMENTS[2:])
def test_its_nodes_carry_pyyaml_lines(text: str) -> None:
    root, _value = node_and_value(text)
    expected = yaml.SafeLoader(text).get_single_node()
    assert _lines(root) == _lines(expected)


@pytest.mark.parametrize("what", BROKEN)
def test_a_broken_document_says_what_pyyaml_says(what: str) -> None:
    text = BROKEN[what]
    with pytest.raises(NotYaml) as ours:
        safe_load(text)
    with pytest.raises(yaml.YAMLError) as theirs:
        yaml.safe_load(text)
    assert type(ours.value.error) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_a_document_nested_past_what_pyyaml_parses_fails_as_it_did() -> None:
    text = "[" * 600 + "]" * 600
    with pytest.raises(RecursionError):
        yaml.safe_load(text)
    with pytest.raises(RecursionError):
        safe_load(text)


def test_a_document_nested_as_deep_as_a_value_may_be_reads_the_same() -> None:
    text = "[" * 80 + "1" + "]" * 80
    assert safe_load(text) == yaml.safe_load(text)


def test_aliases_nested_many_levels_read_in_the_time_their_nodes_take() -> None:
    # Ten lines whose aliases reach one list by 9**11 paths: the depth check looks into each
    # list once, where walking every path kept a start-up busy for days.
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 12)]
    text = "\n".join(lines) + "\n"
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.append(safe_load(text)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert read, "still checking the document's depth after a minute"
    (value,) = read
    assert value["a0"] == ["lol"] * 9
    assert all(item is value["a10"] for item in value["a11"])  # aliases stay shared


def _lines(node: Any) -> list[int]:
    """Every node's first line, in document order."""
    found = [node.start_mark.line]
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            found += _lines(key) + _lines(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found += _lines(item)
    return found


# In a fresh interpreter: read the document in the file named by argv[1]; say its value and
# whether PyYAML had to be imported for it.
READ = """
import json, sys
from pathlib import Path
from bot.yamldoc import safe_load
value = safe_load(Path(sys.argv[1]).read_text())
print(json.dumps({"value": value, "parsed": "yaml" in sys.modules}, default=str))
"""


def read_fresh(cache: Path, document: Path) -> dict[str, Any]:
    said: dict[str, Any] = fresh_python(cache, READ, str(document))
    return said


def test_a_document_read_before_is_read_back_without_the_parser(tmp_path: Path) -> None:
    document = tmp_path / "kestrel.yaml"
    document.write_text("model: {provider: scripted}\nbudgets: {max_tokens: 9, ratio: 0.5}\n")
    first, second = read_fresh(tmp_path, document), read_fresh(tmp_path, document)
    assert first["parsed"] is True and second["parsed"] is False
    assert first["value"] == second["value"] == yaml.safe_load(document.read_text())
    document.write_text("model: {provider: openai}\n")
    edited = read_fresh(tmp_path, document)
    assert edited == {"value": {"model": {"provider": "openai"}}, "parsed": True}


@pytest.mark.parametrize(
    "text",
    [
        "when: 2026-12-04\n",  # a date: JSON would read it back as text
        "1: one\n",  # a key that is no text: JSON would read it back as "1"
        "- &a [1]\n- *a\n",  # an alias: JSON would read back two lists
    ],
)
def test_a_document_json_would_read_back_otherwise_is_parsed_each_time(
    tmp_path: Path, text: str
) -> None:
    document = tmp_path / "doc.yaml"
    document.write_text(text)
    read_fresh(tmp_path, document)
    assert read_fresh(tmp_path, document)["parsed"] is True


def test_a_kept_document_cut_short_is_parsed_again(tmp_path: Path) -> None:
    document = tmp_path / "doc.yaml"
    document.write_text("a: [1, 2]\n")
    read_fresh(tmp_path, document)
    (kept,) = (tmp_path / "kestrel" / "kept").glob("*/documents/*")
    kept.write_text('{"a": [1')
    assert read_fresh(tmp_path, document) == {"value": {"a": [1, 2]}, "parsed": True}


def test_an_int_too_long_to_write_as_text_is_read_and_not_kept(tmp_path: Path) -> None:
    # Python writes no int of more than 4,300 digits as text, json.dumps included; YAML reads
    # a hex or binary one without that limit.
    document = tmp_path / "doc.yaml"
    document.write_text("n: 0x" + "f" * 4000 + "\n")
    code = (
        "import sys; from pathlib import Path; from bot.yamldoc import safe_load;"
        " print(safe_load(Path(sys.argv[1]).read_text())['n'].bit_length())"
    )
    for _ in range(2):
        assert fresh_python(tmp_path, code, str(document)) == 16000
    assert not list((tmp_path / "kestrel" / "kept").glob("*/documents/*"))
