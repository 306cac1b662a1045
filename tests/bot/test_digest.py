"""The digest module's SHA-256 against ``hashlib``'s: journals and stores keep these digests, so
a process that takes them without ``hashlib`` must write the very same bytes."""

import hashlib
import importlib.util
import sys

import pytest

from bot import digest

SAMPLES = [
    b"",
    b"abc",
    "restart checkout \N{SNOWMAN}\n".encode(),
    bytes(range(256)) * 1000,
]


@pytest.mark.parametrize("data", SAMPLES, ids=["empty", "abc", "unicode", "256k"])
def test_sha256_matches_hashlib(data: bytes) -> None:
    ours, theirs = digest.sha256(data), hashlib.sha256(data)
    assert ours.digest() == theirs.digest()
    assert ours.hexdigest() == theirs.hexdigest()


def test_sha256_fed_in_parts_matches_hashlib() -> None:
    running = digest.sha256(b"first part, ")
    running.update(b"second part")
    assert running.hexdigest() == hashlib.sha256(b"first part, second part").hexdigest()


BUILT_IN = [name for name in ("_sha2", "_sha256") if importlib.util.find_spec(name) is not None]


@pytest.mark.skipif(not BUILT_IN, reason="a build without the built-in SHA-256 (hashlib's then)")
def test_sha256_is_the_built_in_module_not_hashlibs() -> None:
    assert digest.sha256 is not hashlib.sha256
    assert type(digest.sha256(b"")).__module__ in ("_sha2", "_sha256")


def test_without_the_built_in_module_hashlibs_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("_sha2", "_sha256"):
        monkeypatch.setitem(sys.modules, name, None)  # as in a build that leaves it out
    assert digest._constructor() is hashlib.sha256
