"""A catalog command that looks everywhere for Kestrel's secrets, and the secrets it must not
find: one per place Kestrel reads them from."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.processes import clean_env

# One secret per place Kestrel reads them from: its environment, ./.env, kestrel.yaml, a file
# tool_isolation.hide names.
IN_ENVIRONMENT = {
    "OPENAI_API_KEY": "sk-env-4f1c9a7e0b",
    "SLACK_BOT_TOKEN": "xoxb-env-8d2e6b1f3a",
    "SLACK_SIGNING_SECRET": "signing-env-5a9c2e7d1b",
    "DISCORD_TOKEN": "discord-env-3b7f0c9e2a",
    "KESTREL_WEB_TOKEN": "webtoken-env-9e1a4c7b2d",
    "KESTREL_WEB_SECRET": "websecret-env-2c8f5a1e9b7d",
}
IN_DOTENV = {"SLACK_APP_TOKEN": "xapp-dotenv-7c3a9e1f5b"}
IN_CONFIG = "yaml-secret-6e2b8d4f0a"
IN_HIDDEN_FILE = "hidden-file-secret-1d5f9b3c7e"
SECRETS = [*IN_ENVIRONMENT.values(), *IN_DOTENV.values(), IN_CONFIG, IN_HIDDEN_FILE]

# Every way a command could look: the parent's /proc entries, every process's, the files Kestrel
# read; then the same after trying to take the covers off, and from a user namespace of its own.
SNOOP = textwrap.dedent(
    """\
    echo "ppid=$PPID processes=$(ls -d /proc/[0-9]* | wc -l)"
    cat "$1" "$2" "$3"
    cat /proc/$PPID/environ /proc/$PPID/cmdline
    for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f"; echo; done
    env
    umount /proc; umount -l /proc; umount "$1"; umount "$2"; umount "$3"
    for f in /proc/[0-9]*/environ; do cat "$f"; echo; done
    cat "$1" "$2" "$3"
    unshare --user --map-root-user --mount -- sh -c \\
      'umount -l /proc; umount "$1"; cat "$1"; cat /proc/[0-9]*/environ' x "$1"
    echo SNOOP-DONE
    """
)
SCRIPT: list[dict[str, Any]] = [
    {"text": "looking", "calls": [{"name": "snoop", "arguments": {}}]},
    {"text": "done"},
]


def prepare(folder: Path, model: dict[str, Any]) -> dict[str, str]:
    """The catalog, the configuration, .env and the hidden file; the environment to run in."""
    (folder / "snoop.sh").write_text(SNOOP)
    secrets = folder / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "extra.txt").write_text(IN_HIDDEN_FILE + "\n")
    config, dotenv = folder / "kestrel.yaml", folder / ".env"
    snoop = {
        "name": "snoop",
        "description": "Looks for secrets",
        "command": ["/bin/sh", "./snoop.sh", str(config), str(dotenv), str(secrets / "extra.txt")],
        "idempotent": True,
    }
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [snoop]}))
    settings = {
        "model": model,
        "tools": ["tools.yaml"],
        "pii": {"mode": "off"},
        "tool_isolation": {"hide": ["secrets/extra.txt"]},
    }
    config.write_text(f"# {IN_CONFIG}\n" + yaml.safe_dump(settings))
    dotenv.write_text("".join(f"{name}={value}\n" for name, value in IN_DOTENV.items()))
    return clean_env(**IN_ENVIRONMENT)


def found(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]
