"""What each recognizer needs of a text (``Recognizer.needs``) holds wherever it finds a hit.

The scanner gives a short text only to the recognizers whose needs it holds, so a need that a
hit can lack would let that hit through. Each is held here over every sample the PII tests
give (their constants, parameters and the strings their code builds from them), the bench's
log corpus with its secrets, the texts those decode to, and variants the scan reads through:
folded (full-width, invisible characters), JSON-escaped, in either case, among other text.
"""

from __future__ import annotations

import ast
import importlib
import json
import random
import string
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bench.pii_throughput import build_corpus, split_chunks
from bot.pii.encoded import find_encoded
from bot.pii.guard import PiiGuard, PiiSettings
from bot.pii.recognizers import RECOGNIZERS, Scanner
from bot.pii.scantext import PiiHit, ScanText, load_finder

HERE = Path(__file__).resolve().parent
SCAN = Scanner()
# Needs are read only for texts up to 1024 characters; the samples are kept to four times that.
_LONGEST = 4096


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a value, its containers walked (a parameter list, a table of samples)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    elif isinstance(value, dict) and depth < 6:
        for key, item in value.items():
            yield from _strings(key, depth + 1)
            yield from _strings(item, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)) and depth < 6:
        for item in value:
            yield from _strings(item, depth + 1)


def _built(tree: ast.AST, namespace: dict[str, Any]) -> Iterator[str]:
    """The string constants of a test module, and the f-strings and concatenations of its code
    that call nothing, evaluated over the module's names (those of a test's locals fail)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.JoinedStr, ast.BinOp)) and not any(
            isinstance(inner, ast.Call) for inner in ast.walk(node)
        ):
            try:
                value = eval(compile(ast.Expression(node), "<sample>", "eval"), dict(namespace))
            except Exception:  # a local name: that string is not a sample here
                continue
            yield from _strings(value)


def _test_samples() -> set[str]:
    """Every string the PII tests hold or build from their modules' names."""
    samples: set[str] = set()
    for path in sorted(HERE.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        module = importlib.import_module(f"tests.bot.pii.{path.stem}")
        namespace = vars(module)
        for value in list(namespace.values()):
            samples.update(_strings(value))
            for mark in getattr(value, "pytestmark", ()):
                samples.update(_strings(mark.args))
        samples.update(_built(ast.parse(path.read_text()), namespace))
    # The long ones repeat a unit to time a pathological text: their first part has its hits.
    return {sample[:_LONGEST] for sample in samples if sample}


def _bench_samples() -> set[str]:
    """The bench's log corpus, with its secrets at a high rate: lines, and chunks of lines."""
    corpus = build_corpus(120_000, seed=7, pii_rate=0.3)
    return set(corpus.splitlines()) | set(split_chunks(corpus, 2048))


_FULL_WIDTH = {code: code + 0xFEE0 for code in range(0x21, 0x7F)}


def _variants(text: str, rng: random.Random) -> Iterator[str]:
    """The text, and the forms of it the scan reads through to the same characters or near."""
    yield text
    yield text.upper()
    yield text.lower()
    yield json.dumps(text)[1:-1]  # a JSON string's body: "\n" escaped, quotes escaped
    yield text.translate(_FULL_WIDTH)  # folded back to ASCII
    yield "\u200b".join(text[i : i + 7] for i in range(0, len(text), 7))  # invisible, dropped
    yield text.replace(" ", "\u00a0")  # a no-break space reads as a blank
    cut = rng.randrange(len(text) + 1)
    yield f"{text[:cut]}\n{text[cut:]}"
    noise = "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))
    yield f"{noise} {text} {noise[::-1]}"


def _decoded(texts: Iterable[str]) -> set[str]:
    """What the encoded secrets among ``texts`` decode to (the scanner reads those too)."""
    found: set[str] = set()

    def rescan(decoded: str) -> list[PiiHit]:
        found.add(decoded)
        return SCAN(decoded)

    for text in texts:
        for _ in find_encoded(ScanText(text), rescan):
            pass
    return found


def _corpus() -> list[str]:
    rng = random.Random(20240501)
    samples = sorted(_test_samples() | _bench_samples())
    texts = {variant for sample in samples for variant in _variants(sample, rng)}
    texts |= _decoded(texts)
    # Two samples side by side: a hit may need what its neighbour holds.
    texts |= {f"{rng.choice(samples)} {rng.choice(samples)}" for _ in range(2000)}
    return sorted(texts)


def test_every_recognizer_hit_is_in_a_text_that_holds_its_needs() -> None:
    lacking: list[tuple[str, str]] = []
    found: set[str] = set()
    for text in _corpus():
        src = ScanText(text)
        for recognizer in RECOGNIZERS:
            name = load_finder(recognizer.finder).__name__
            if next(iter(load_finder(recognizer.finder)(src)), None) is None:
                continue
            found.add(name)
            if not recognizer.needs.held(src):
                lacking.append((name, text))
    assert lacking == []
    # The check holds something: every recognizer found a hit in the corpus.
    assert sorted({load_finder(r.finder).__name__ for r in RECOGNIZERS} - found) == []


def test_a_plain_short_text_is_given_to_no_recognizer() -> None:
    # A chat prompt of words alone holds none of their needs: none is called, so a fresh
    # process's first scan runs none of their code (a tenth of a first suspend's scan).
    finders = {load_finder(recognizer.finder).__code__ for recognizer in RECOGNIZERS}
    called: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in finders:
            called.append(frame.f_code.co_name)

    guard = PiiGuard(PiiSettings())
    sys.setprofile(profile)
    try:
        prompt = guard.scan_prompt("restart checkout")
        output = guard.scan_output("restarted checkout on the second node")
    finally:
        sys.setprofile(None)
    assert (prompt.allowed, prompt.text, output.text) == (
        True,
        "restart checkout",
        "restarted checkout on the second node",
    )
    assert called == []


def test_a_short_text_still_gets_every_recognizer_its_needs_allow() -> None:
    # The gate skips only what a text lacks: a short text with an address and a card number
    # is redacted as before.
    guard = PiiGuard(PiiSettings())
    outcome = guard.scan_output("mail bob@example.com, card 4111 1111 1111 1111")
    assert outcome.text == "mail <EMAIL_ADDRESS>, card <CREDIT_CARD>"
