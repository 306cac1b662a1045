"""Kestrel: a chat-ops agent running a durable LLM agent loop, with people in the loop."""

# The one place the version and the distribution's name are written: pyproject.toml reads
# ``__version__`` (setuptools' dynamic version), and hints name the extras by ``DISTRIBUTION``.
DISTRIBUTION = "kestrel-chatops"
__version__ = "0.3.0.dev0"


def install_hint(extra: str) -> str:
    """How to install one of the optional extras (``postgres``, ``mcp``)."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a clone: pip install -e '.[{extra}]')"
