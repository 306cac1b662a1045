"""Adapters import only the chat room: ``bot.chat.*``, ``bot.events`` and a short justified list."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"

# The chat room itself: the service, its handles, views, threads, outbox, words, the contract.
CHAT_ROOM = ("bot.chat", "bot.events")

# Core modules any adapter may import besides the chat room, and why.
ALLOWED = {
    # The value vocabulary every view the service hands out is made of (Session, RequestStatus...).
    "bot.domain",
    # Pure string helpers with no state and no I/O: escaping, one-line errors, nesting depth.
    "bot.text",
    "bot.oneline",
    "bot.nesting",
    # The one User-Agent string every outgoing HTTP client sends.
    "bot.user_agent",
}

# An adapter's own settings file reads its environment with the shared settings helpers, and
# checks its tokens as the model key is checked (``pasted_token``).
SETTINGS_ONLY = {"bot.config.settings", "bot.config.sources"}


def in_chat_room(module: str) -> bool:
    """Whether ``module`` is the chat room or inside it."""
    return any(module == room or module.startswith(room + ".") for room in CHAT_ROOM)


def core_imports(path: Path) -> list[str]:
    """Every ``bot.*`` module ``path`` imports, however nested the import statement is."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [m for m in found if m == "bot" or m.startswith("bot.")]


def strays(path: Path) -> list[str]:
    """The ``bot.*`` imports of ``path`` outside the chat room and the allow-list."""
    allowed = ALLOWED | (SETTINGS_ONLY if path.name == "settings.py" else set())
    return [m for m in core_imports(path) if not in_chat_room(m) and m not in allowed]


def test_adapters_import_only_the_chat_room() -> None:
    files = sorted(ADAPTERS.rglob("*.py"))
    assert len(files) > 20, "the walk found the adapters"
    found = {str(p.relative_to(ADAPTERS)): strays(p) for p in files}
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_the_walk_sees_a_stray_import(tmp_path: Path) -> None:
    stray = tmp_path / "look.py"
    stray.write_text("def f() -> None:\n    from bot.run.supervisor import Supervisor\n")
    assert strays(stray) == ["bot.run.supervisor"]
    settings = tmp_path / "settings.py"
    settings.write_text("from bot.config.settings import ConfigError\nimport bot.store\n")
    assert strays(settings) == ["bot.store"]
