"""Models' schemas kept between processes: read back, validating as built, trusted only if ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# In a fresh interpreter: use a settings section (valid and invalid), say whether pydantic
# built it.
USE = """
import json
from pydantic import ValidationError
from bot.config.settings import BudgetSettings
made = BudgetSettings(max_iterations=5)
try:
    BudgetSettings(max_iterations=0)
    refused = False
except ValidationError:
    refused = True
print(json.dumps({"built": BudgetSettings.__pydantic_complete__, "refused": refused,
                  "dumped": made.model_dump_json()}))
"""

# The serializer first (a model built without validation), then the validator.
SERIALIZED_FIRST = """
import json
from bot.config.settings import BudgetSettings
dumped = BudgetSettings.model_construct(max_iterations=7).model_dump_json()
made = BudgetSettings(max_tokens=9)
print(json.dumps({"built": BudgetSettings.__pydantic_complete__, "refused": False,
                  "dumped": dumped + made.model_dump_json()}))
"""


def use(cache: Path, script: str = USE, **env: str) -> dict[str, object]:
    """Run ``script`` in a fresh process with ``cache`` as the cache home."""
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "XDG_CACHE_HOME": str(cache), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    said: dict[str, object] = json.loads(out.stdout)
    return said


def kept(cache: Path) -> list[str]:
    return sorted(path.name for path in (cache / "kestrel" / "models").glob("*/*"))


def test_a_model_built_once_is_read_back_and_validates_alike(tmp_path: Path) -> None:
    first = use(tmp_path)
    assert "bot.config.settings.BudgetSettings" in kept(tmp_path)
    second = use(tmp_path)
    assert first["built"] is True and second["built"] is False  # read back, not built
    assert first["refused"] is True and second["refused"] is True
    assert first["dumped"] == second["dumped"]


def test_a_model_read_back_serializes_before_it_validates(tmp_path: Path) -> None:
    first = use(tmp_path, SERIALIZED_FIRST)
    second = use(tmp_path, SERIALIZED_FIRST)
    assert first["built"] is True and second["built"] is False
    assert first["dumped"] == second["dumped"]
    dumped = str(second["dumped"])
    assert '"max_iterations":7' in dumped and '"max_tokens":9' in dumped


@pytest.mark.parametrize(
    "hook",
    [
        "None",  # a pydantic release that moved its internals
        "type('Other', (), {})",  # one whose hook takes other arguments
    ],
)
def test_without_pydantics_hook_models_are_built_as_pydantic_builds_them(
    tmp_path: Path, hook: str
) -> None:
    said = use(tmp_path, f"import bot.model_cache\nbot.model_cache._Mock = {hook}\n{USE}")
    assert said["built"] is True and said["refused"] is True
    assert '"max_iterations":5' in str(said["dumped"])
    assert kept(tmp_path) == []


def test_a_folder_others_may_write_to_is_not_trusted(tmp_path: Path) -> None:
    use(tmp_path)
    (folder,) = (tmp_path / "kestrel" / "models").iterdir()
    folder.chmod(0o777)
    assert use(tmp_path)["built"] is True


def test_the_cache_can_be_turned_off(tmp_path: Path) -> None:
    assert use(tmp_path, KESTREL_MODEL_CACHE="off")["built"] is True
    assert kept(tmp_path) == []
