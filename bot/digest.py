"""SHA-256 without importing ``hashlib``: its import loads OpenSSL's ``_hashlib`` and looks up
every algorithm (6 M instructions), most of a short process's digest cost (``runs approve``
takes a handful of digests). The interpreter's own module gives the same bytes for 0.4 M."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

# For the type checker alone: a protocol class costs every process that imports this module
# (``runs approve`` among them) 0.16 M instructions to create, and nothing checks it at run time.
if TYPE_CHECKING:

    class Hash(Protocol):
        """A running SHA-256 (``hashlib``'s hash objects and the built-in module's alike)."""

        def update(self, data: bytes, /) -> None:
            """Feed more bytes."""

        def digest(self) -> bytes:
            """The digest of the bytes fed so far."""

        def hexdigest(self) -> str:
            """The digest as lowercase hexadecimal."""


def _constructor() -> Callable[[bytes], Hash]:
    """The built-in module's ``sha256`` (``_sha2`` from Python 3.12, ``_sha256`` before); where
    a build leaves it out, ``hashlib``'s, which falls back between the two the other way round
    (OpenSSL first, then these same modules)."""
    for name in ("_sha2", "_sha256"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        built_in: Callable[[bytes], Hash] = module.sha256
        return built_in
    import hashlib

    return hashlib.sha256


sha256: Callable[[bytes], Hash] = _constructor()
"""A new SHA-256 of the given bytes (``sha256(data).hexdigest()``)."""
