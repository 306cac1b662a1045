"""bot.kept: a folder of files kept between processes, used only when it is ours alone."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot import kept


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("KESTREL_MODEL_CACHE", raising=False)
    forget()
    yield tmp_path
    forget()


def forget() -> None:
    """What a fresh process would know: nothing asked yet."""
    kept._keyed_folder.cache_clear()
    kept._trusted_folder.cache_clear()
    kept._module_stamp.cache_clear()


def test_the_folder_is_made_for_this_user_only(cache_home: Path) -> None:
    assert kept.kept_folder() is None  # not made yet
    folder = kept.kept_folder(create=True)
    assert folder is not None and folder.parent == cache_home / "kestrel" / "kept"
    assert folder.stat().st_mode & 0o777 == 0o700
    forget()
    assert kept.kept_folder() == folder


def test_a_folder_others_may_write_to_is_not_used() -> None:
    folder = kept.kept_folder(create=True)
    assert folder is not None
    folder.chmod(0o777)
    forget()
    assert kept.kept_folder() is None
    assert kept.kept_folder(create=True) is None


def test_the_folder_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KESTREL_MODEL_CACHE", "off")
    assert kept.kept_folder(create=True) is None


def test_folders_of_other_code_unused_for_a_week_are_removed(cache_home: Path) -> None:
    stale = cache_home / "kestrel" / "kept" / "other-code-stale"
    recent = cache_home / "kestrel" / "kept" / "other-code-recent"
    stale.mkdir(mode=0o700, parents=True)
    recent.mkdir(mode=0o700)
    week_ago = time.time() - 8 * 24 * 3600
    os.utime(stale, (week_ago, week_ago))
    assert kept.kept_folder(create=True) is not None
    assert not stale.exists() and recent.exists()


def test_the_folder_is_used_whatever_the_umask() -> None:
    # With umask 002 (a user's own group), folders made by mode would be group-writable.
    was = os.umask(0o002)
    try:
        assert kept.kept_folder(create=True) is not None
    finally:
        os.umask(was)
    forget()
    assert kept.kept_folder() is not None


def test_a_file_that_cannot_be_kept_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    kept.keep("documents", "name", b"data")
    folder = kept.kept_folder()
    assert folder is not None and list((folder / "documents").iterdir()) == []


def test_a_fifo_or_a_link_where_a_file_was_kept_is_nothing_kept(tmp_path: Path) -> None:
    kept.keep("documents", "file", b"data")
    folder = kept.kept_folder()
    assert folder is not None and kept.recall("documents", "file") == b"data"
    os.mkfifo(folder / "documents" / "fifo")  # reading it would wait for a writer forever
    (folder / "documents" / "link").symlink_to(folder / "documents" / "file")
    assert kept.recall("documents", "fifo") is None
    assert kept.recall("documents", "link") is None


def test_the_key_stamps_every_module_below_and_an_edit_changes_it(tmp_path: Path) -> None:
    package = tmp_path / "package"
    (package / "sub" / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").write_text("B = 1\n")
    (package / "sub" / "__pycache__" / "c.py").write_text("")  # compiled code: not a module
    (package / "notes.txt").write_text("")
    first = sorted(kept._stamps(str(package)))
    assert [stamp.rsplit(":", 2)[0] for stamp in first] == [
        f"{package}/a.py",
        f"{package}/sub/b.py",
    ]
    (package / "sub" / "b.py").write_text("B = 22\n")  # one byte more: the size says so
    assert sorted(kept._stamps(str(package))) != first


def test_a_name_covers_the_code_of_each_module_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "kept_probe_parser.py").write_text("A = 1\n")
    first = kept.name_of("doc", modules=("kept_probe_parser",))
    assert kept.name_of("doc", modules=("kept_probe_parser", "json")) != first
    assert kept.name_of("doc", modules=("kept_probe_parser",)) == first
    (tmp_path / "kept_probe_parser.py").write_text("A = 22\n")  # an upgrade, in a new process
    forget()
    assert kept.name_of("doc", modules=("kept_probe_parser",)) != first
    assert kept.name_of("doc", modules=("kept_probe_missing",)) is not None  # not installed
