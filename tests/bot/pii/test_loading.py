"""The recognizers' finder modules are imported the first time a scan reaches one of their
finders: a process whose texts are plain words (a chat prompt, ``runs approve``'s tool output)
imports none, and one whose texts hold secrets imports them and finds what it always found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bot.pii.emails import LOOSE_AT_STARTS
from bot.pii.guard import WITHHELD_MESSAGE, resolve_overlaps
from bot.pii.labelled import _KEYED_WORDS, _SECURE_PATTERNS
from bot.pii.numbers import CARD_RUN_START, IBAN_START, SEPARATED
from bot.pii.recognizers import RECOGNIZERS, Scanner
from bot.pii.shapes import _PRINTING_COMMANDS
from tests.bot.pii.test_recognizers import TRUE_POSITIVES

PII = Path(__file__).resolve().parents[3] / "bot" / "pii"
# What the guard is built from at start-up; every other module of the package holds finders.
START_UP = {"__init__", "guard", "hooks", "recognizers", "scantext", "settings"}
FINDER_MODULES = sorted(
    f"bot.pii.{path.stem}" for path in PII.glob("*.py") if path.stem not in START_UP
)

# A fresh process: the guard's hooks imported, the texts on stdin scanned as tool outputs, then
# the finder modules it imported and the hits of each text written out.
SCANNED = """
import json, sys
import bot.pii.hooks
from bot.pii.guard import PiiGuard, PiiSettings, resolve_overlaps
from bot.pii.recognizers import Scanner
guard, scan, texts = PiiGuard(PiiSettings()), Scanner(), json.load(sys.stdin)
outputs = [guard.scan_output(text).text for text in texts]
hits = [[[h.entity_type, h.start, h.end] for h in resolve_overlaps(scan(t), len(t))] for t in texts]
modules = [name for name in json.loads(sys.argv[1]) if name in sys.modules]
print(json.dumps({"modules": modules, "hits": hits, "outputs": outputs}))
"""

# The same texts scanned at once by several threads of a fresh process through one scanner,
# each thread's hits written out: the first calls load the finders while others scan.
SCANNED_AT_ONCE = """
import json, sys, threading
from bot.pii.guard import resolve_overlaps
from bot.pii.recognizers import Scanner
scan, texts, threads = Scanner(), json.load(sys.stdin), 8
start, found = threading.Barrier(threads), [None] * threads
def run(index):
    start.wait()
    hits = [resolve_overlaps(scan(text), len(text)) for text in texts]
    found[index] = [[[h.entity_type, h.start, h.end] for h in each] for each in hits]
workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
for worker in workers: worker.start()
for worker in workers: worker.join()
print(json.dumps(found))
"""


def scanned_fresh(texts: list[str]) -> dict[str, Any]:
    """What a fresh interpreter that scans ``texts`` imports of the finder modules, and finds."""
    argv = [sys.executable, "-c", SCANNED, json.dumps(FINDER_MODULES)]
    out = subprocess.run(argv, input=json.dumps(texts), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def hits_in_process(texts: list[str]) -> list[list[list[object]]]:
    """The hits of each text as this process finds them (every finder module imported)."""
    scan = Scanner()
    return [
        [[hit.entity_type, hit.start, hit.end] for hit in resolve_overlaps(scan(text), len(text))]
        for text in texts
    ]


def test_the_finder_modules_are_the_package_s_others() -> None:
    # The check below holds something: the finders live in these modules.
    assert {"bot.pii.credentials", "bot.pii.labelled", "bot.pii.numbers"} <= set(FINDER_MODULES)


def test_scanning_plain_words_imports_no_finder_module() -> None:
    texts = ["restart checkout", "restarted checkout", "restarted checkout on the second node"]
    found = scanned_fresh(texts)
    assert found["modules"] == []
    assert found["outputs"] == texts


def test_scanning_secrets_of_every_family_imports_their_modules_and_finds_them() -> None:
    texts = sorted({sample for _entity, sample, _found in TRUE_POSITIVES})
    found = scanned_fresh(texts)
    assert found["modules"] == FINDER_MODULES
    expected = hits_in_process(texts)
    assert found["hits"] == expected
    # Each sample's hits name its entity type, as test_recognizers.py finds them in process.
    named = {text: {hit[0] for hit in hits} for text, hits in zip(texts, expected, strict=True)}
    assert [(e, text) for e, text, _ in TRUE_POSITIVES if e not in named[text]] == []


# What a command's output with its exit status does not reach: the finders that read labels
# and the modules they import (some 7 M instructions to import), the numbers' (an exit status
# is no number of theirs) and the emails' ("status" holds "at", but no written-out "at").
UNREACHED = (
    "credentials",
    "encoded",
    "labelled",
    "manifests",
    "shapes",
    "web",
    "numbers",
    "emails",
)


def test_a_command_s_output_with_its_exit_status_imports_no_label_number_or_email_finder() -> None:
    # What ``kestrel runs approve`` scans of a catalog command: a digit and a line break, but
    # no word a label or a printed secret is found after, and no digits a number is made of.
    texts = ["restarted checkout\n[exit status 0]", "deployed 3 pods in 12s\n[exit status 1]"]
    found = scanned_fresh(texts)
    assert [name for name in found["modules"] if name.split(".")[-1] in UNREACHED] == []
    assert found["outputs"] == texts


def test_the_words_a_gate_also_needs_are_those_its_finder_looks_for() -> None:
    # Each finder's own first test, read off it: a word it looks for before any pattern.
    also = {r.finder: set(r.needs.also) for r in RECOGNIZERS}
    assert also["labelled.find_keyed_secrets"] == set(_KEYED_WORDS)
    assert also["emails.find_loose_emails"] == set(LOOSE_AT_STARTS)
    assert also["shapes.find_printed_secrets"] == {
        w for *_, gate in _PRINTING_COMMANDS for w in gate
    }
    literals = {literal.lower() for _, literals in _SECURE_PATTERNS for literal in literals}
    assert all(
        any(word in literal for word in also["labelled.find_secure_strings"])
        for literal in literals
    )


def test_threads_that_load_the_finders_at_once_find_what_one_finds() -> None:
    texts = sorted({sample for _entity, sample, _found in TRUE_POSITIVES})
    argv = [sys.executable, "-c", SCANNED_AT_ONCE]
    out = subprocess.run(argv, input=json.dumps(texts), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    expected = hits_in_process(texts)
    assert json.loads(out.stdout) == [expected] * 8


def test_the_runs_a_number_gate_needs_are_those_its_finder_searches() -> None:
    # The shape's runs each number finder searches for first, read off it.
    shaped = {r.finder: set(r.needs.shaped) for r in RECOGNIZERS}
    separated = {f"0{sep}0".encode() for _, sep in SEPARATED}
    assert shaped["numbers.find_separated_numbers"] == separated
    assert shaped["numbers.find_card_runs"] == {CARD_RUN_START}
    assert shaped["numbers.find_ibans"] == {IBAN_START}


# A fresh process whose finder module (argv[1]) raises on import until told otherwise: each
# text is scanned as a tool output and as a prompt under redact and reject, then once more as
# a tool output after the module imports again.
SCANNED_BROKEN = """
import importlib.abc, json, sys
class Broken(importlib.abc.MetaPathFinder):
    armed = True
    def find_spec(self, name, path, target=None):
        if name == sys.argv[1] and self.armed:
            raise RuntimeError("cannot import " + name)
broken = Broken()
sys.meta_path.insert(0, broken)
from bot.pii.guard import PiiGuard, PiiMode, PiiSettings
texts = json.load(sys.stdin)
guards = [PiiGuard(PiiSettings(mode=mode)) for mode in (PiiMode.REDACT, PiiMode.REJECT)]
scans = [scan for guard in guards for scan in (guard.scan_output, guard.scan_prompt)]
failed = [[(o.allowed, o.text, o.error) for o in (scan(t) for scan in scans)] for t in texts]
broken.armed = False
again = [guards[0].scan_output(t).error for t in texts]
print(json.dumps({"failed": failed, "again": again}))
"""


def test_a_finder_module_that_fails_to_import_withholds_the_text_and_is_tried_again() -> None:
    # The import now happens mid-scan, not at start-up: the text that reaches the finder must
    # never pass as it was (redact and reject withhold it), and a later scan imports again.
    texts = ["card 4111 1111 1111 1111", "call +44 20 7946 0958", "IBAN GB82WEST12345698765432"]
    argv = [sys.executable, "-c", SCANNED_BROKEN, "bot.pii.numbers"]
    out = subprocess.run(argv, input=json.dumps(texts), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    cause = "RuntimeError: cannot import bot.pii.numbers"
    redact = [(True, WITHHELD_MESSAGE, cause)] * 2
    reject = [(True, WITHHELD_MESSAGE, cause), (False, WITHHELD_MESSAGE, cause)]
    assert found["failed"] == [[list(o) for o in redact + reject]] * len(texts)
    assert found["again"] == [None] * len(texts)


def test_loading_the_finders_imports_every_finder_module() -> None:
    # What ``kestrel serve`` does at start (bot.cli.compose.load_scanner).
    script = (
        "import json, sys\nfrom bot.pii.recognizers import load_finders\nload_finders()\n"
        "print(json.dumps([name for name in json.loads(sys.argv[1]) if name in sys.modules]))"
    )
    argv = [sys.executable, "-c", script, json.dumps(FINDER_MODULES)]
    out = subprocess.run(argv, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == FINDER_MODULES
