"""Clean schema verdicts kept between processes: reused only for the same schema and arguments,
never for others, and only from a folder no one else may write to."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from tests.fakes.processes import fresh_python

# In a fresh interpreter: check one call of a gated command tool (or load a catalog), and say
# what was refused and whether jsonschema had to be imported for it.
CHECK = """
import json, sys
from bot.tools.base import ApprovalPolicy, ToolFlags
from bot.tools.command import CommandTool
schema, arguments, confirm = json.loads(sys.argv[1])
tool = CommandTool("restart", "Restart", ["/bin/echo", "{unit}"], parameters=schema,
                   flags=ToolFlags(approval=ApprovalPolicy(confirm=confirm)))
print(json.dumps({"errors": tool.argument_errors(arguments),
                  "imported": "jsonschema" in sys.modules}))
"""
LOAD = """
import json, sys
from bot.tools.catalog import check_catalog
print(json.dumps({"errors": check_catalog(sys.argv[1]), "imported": "jsonschema" in sys.modules}))
"""
SCHEMA = {
    "type": "object",
    "properties": {"unit": {"type": "string", "pattern": "^[a-z]+$"}},
    "required": ["unit"],
    "additionalProperties": False,
}


def check(
    cache: Path, arguments: dict[str, Any], schema: dict[str, Any] = SCHEMA, **env: str
) -> dict[str, Any]:
    said: dict[str, Any] = fresh_python(cache, CHECK, json.dumps([schema, arguments, True]), **env)
    return said


def verdicts(cache: Path) -> list[Path]:
    return list((cache / "kestrel" / "kept").glob("*/verdicts/*"))


def test_a_gated_call_found_valid_is_not_checked_again_in_a_later_process(
    tmp_path: Path,
) -> None:
    first = check(tmp_path, {"unit": "nginx"})
    second = check(tmp_path, {"unit": "nginx"})
    assert first == {"errors": [], "imported": True}
    assert second == {"errors": [], "imported": False}  # the kept verdict, no jsonschema


def test_other_arguments_are_checked_whatever_was_kept(tmp_path: Path) -> None:
    check(tmp_path, {"unit": "nginx"})
    refused = check(tmp_path, {"unit": "nginx\n"})
    assert refused["imported"] is True
    assert refused["errors"] == ["unit: 'nginx\\n' does not match '^[a-z]+$'"]
    assert check(tmp_path, {"unit": "nginx", "more": 1})["errors"] != []


def test_a_changed_schema_checks_the_same_arguments_again(tmp_path: Path) -> None:
    check(tmp_path, {"unit": "nginx"})
    tighter = json.loads(json.dumps(SCHEMA))
    tighter["properties"]["unit"]["maxLength"] = 3
    refused = check(tmp_path, {"unit": "nginx"}, tighter)
    assert refused == {"errors": ["unit: 'nginx' is too long"], "imported": True}


def test_argv_rules_still_apply_to_arguments_found_valid(tmp_path: Path) -> None:
    loose = {"type": "object", "properties": {"unit": {"type": "string"}}}
    check(tmp_path, {"unit": "-rf"}, loose)  # the schema allows it; the argv rule does not
    again = check(tmp_path, {"unit": "-rf"}, loose)
    assert len(again["errors"]) == 1 and "must not start with '-'" in again["errors"][0]


def test_an_ungated_call_keeps_nothing(tmp_path: Path) -> None:
    fresh_python(tmp_path, CHECK, json.dumps([SCHEMA, {"unit": "nginx"}, False]))
    assert verdicts(tmp_path) == []


def test_a_folder_others_may_write_to_is_not_trusted(tmp_path: Path) -> None:
    check(tmp_path, {"unit": "nginx"})
    (folder,) = (tmp_path / "kestrel" / "kept").iterdir()
    folder.chmod(0o777)
    assert check(tmp_path, {"unit": "nginx"})["imported"] is True


def test_nothing_is_kept_with_the_cache_off(tmp_path: Path) -> None:
    assert check(tmp_path, {"unit": "nginx"}, KESTREL_MODEL_CACHE="off")["errors"] == []
    assert check(tmp_path, {"unit": "nginx"}, KESTREL_MODEL_CACHE="off")["imported"] is True
    assert verdicts(tmp_path) == []


def test_a_sound_catalog_is_read_again_without_jsonschema_and_a_broken_one_never(
    tmp_path: Path,
) -> None:
    entry = """\
        tools:
          - name: restart
            description: Restart
            command: ["/bin/echo", "{unit}"]
            parameters: %s
        """
    sound = tmp_path / "sound.yaml"
    sound.write_text(textwrap.dedent(entry) % json.dumps(SCHEMA))
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        textwrap.dedent(entry) % '{"type": "object", "properties": {"unit": {}}, "required": 3}'
    )
    assert fresh_python(tmp_path, LOAD, str(sound)) == {"errors": [], "imported": True}
    assert fresh_python(tmp_path, LOAD, str(sound)) == {"errors": [], "imported": False}
    for _ in range(2):
        refused = fresh_python(tmp_path, LOAD, str(broken))
        assert refused["imported"] is True
        assert len(refused["errors"]) == 1 and "invalid JSON Schema" in refused["errors"][0]
