"""Every YAML example of the docs, copied as it is, is taken by ``kestrel serve``: a newcomer
pastes the policy of docs/slack.md into ``kestrel.yaml`` and expects a replica, not a refusal.

A block that is a mapping is a ``kestrel.yaml``, or a catalog when it starts with a comment
naming the catalog's file (``# tools/systemd.yaml, a catalog``); a block that is a list shows
keys of a tool of the catalog before it, the rest elided (``# …``): it is checked as that
catalog with those keys added to the tool they name."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fakes.processes import KESTREL, ROOT, clean_env
from tests.fakes.serving import free_port, wait_healthy

_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CATALOG = re.compile(r"\A# (\S+\.yaml), a catalog")


def _examples() -> list[tuple[str, str]]:
    """(where, text) of each YAML block of the docs, as the file it is or extends."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        markdown = doc.read_text()
        catalog = ""  # the last catalog of this page, which a list block extends
        for block in _BLOCK.finditer(markdown):
            text = block[1]
            if isinstance(yaml.safe_load(text), list):
                text = _extended(catalog, yaml.safe_load(text)) if catalog else text
            elif _CATALOG.match(text):
                catalog = text
            line = markdown.count("\n", 0, block.start()) + 1
            found.append((f"docs/{doc.name}:{line}", text))
    return found


def _extended(catalog: str, tools: list[dict[str, object]]) -> str:
    """``catalog`` (a block's text) with each of ``tools``' keys added to the tool it names;
    a tool it does not have is added whole (and its catalog then says what is missing)."""
    document = yaml.safe_load(catalog)
    named = {tool["name"]: tool for tool in document["tools"]}
    for tool in tools:
        if tool.get("name") in named:
            named[str(tool["name"])].update(tool)
        else:
            document["tools"].append(tool)
    return f"{catalog.splitlines()[0]}\n{yaml.safe_dump(document)}"


EXAMPLES = _examples()


def test_the_docs_have_examples_to_check() -> None:
    # Guards the extraction itself: a changed fence or folder would leave nothing tested.
    assert {where.split(":")[0] for where, _ in EXAMPLES} >= {
        "docs/configuration.md",
        "docs/slack.md",
        "docs/discord.md",
    }


def _write(folder: Path, text: str) -> None:
    """The example where a reader puts it: a catalog at the path its comment names, beside a
    ``kestrel.yaml`` that lists it; anything else as the ``kestrel.yaml``."""
    catalog = _CATALOG.match(text)
    if catalog is None:
        (folder / "kestrel.yaml").write_text(text)
        return
    path = folder / catalog[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (folder / "kestrel.yaml").write_text(f"tools: [{catalog[1]}]\n")


@pytest.mark.parametrize(("where", "text"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
async def test_each_docs_example_starts_a_replica(tmp_path: Path, where: str, text: str) -> None:
    _write(tmp_path, text)
    port = free_port()
    serve = subprocess.Popen(  # noqa: ASYNC220 - a process that outlives this call
        [*KESTREL, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await wait_healthy(port, serve)
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=30)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert serve.returncode == 0, f"{where}: {err}"
    assert "kestrel: " not in err, f"{where}: {err}"
