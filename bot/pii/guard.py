"""The PII guard: scans prompts and tool outputs, then redacts, rejects or lets them pass.

Recognizers live in bot.pii.recognizers. Rewriting goes through presidio-anonymizer's
operators, except the default replace, which is a fixed string per entity type and is
spliced in directly (the engine rebuilds the whole text once per hit).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from bot.pii.recognizers import Scanner
from bot.pii.scantext import ENTITY_TYPES, PiiHit, priority
from bot.pii.settings import OperatorSpec, PiiMode, PiiSettings

if TYPE_CHECKING:
    from presidio_anonymizer import AnonymizerEngine, OperatorConfig, RecognizerResult

__all__ = [
    "ENTITY_TYPES",
    "WITHHELD_MESSAGE",
    "OperatorSpec",
    "PiiBuildError",
    "PiiGuard",
    "PiiHit",
    "PiiMode",
    "PiiSettings",
    "ScanOutcome",
    "resolve_overlaps",
]

WITHHELD_MESSAGE = "[withheld by the PII guard: this text contained sensitive data]"

# One salt for every guard of the process: equal values hash equally, across rebuilt guards
# too, while the hashes cannot be matched against another process's or precomputed tables.
# The system's random source, as ``secrets.token_bytes`` reads it (``secrets`` imports
# ``random`` and ``hmac``: a millisecond of every start).
_PROCESS_SALT = os.urandom(32)
_ERROR_LIMIT = 300


class ScanOutcome(msgspec.Struct, frozen=True):
    """The verdict on one text: whether it may go on, what to pass on, and what was found."""

    allowed: bool
    text: str
    hits: tuple[PiiHit, ...]
    error: str | None


class PiiBuildError(Exception):
    """The scanner or the anonymizer cannot be built from the settings."""


class _Redactor:
    """Rewrites the hits of a text with the configured operators."""

    def __init__(self, operators: Mapping[str, OperatorSpec]) -> None:
        self._replacements: dict[str, str] = {}
        self._configs: dict[str, OperatorConfig] = {}
        kept = {entity: spec for entity, spec in operators.items() if spec.type != "replace"}
        for entity, spec in operators.items():
            if spec.type == "replace":
                self._replacements[entity] = spec.new_value or f"<{entity}>"
        if not kept:
            return  # replacing needs no engine: presidio is imported only for other operators
        try:
            from presidio_anonymizer import AnonymizerEngine, OperatorConfig, RecognizerResult
        except Exception as exc:  # a broken install fails in many ways, all of them fatal here
            raise PiiBuildError(f"presidio-anonymizer cannot be imported: {exc}") from exc
        self._engine: AnonymizerEngine = AnonymizerEngine()  # type: ignore[no-untyped-call]
        self._span: type[RecognizerResult] = RecognizerResult
        for entity, spec in kept.items():
            try:
                self._configs[entity] = OperatorConfig(spec.type, _operator_params(spec))
                self._render(entity, "sample value")  # bad parameters fail now, not mid-run
            except Exception as exc:
                raise PiiBuildError(f"operator for {entity}: {exc}") from exc

    def __call__(self, text: str, hits: Sequence[PiiHit]) -> str:
        """The text with every hit (sorted, not overlapping) rewritten."""
        parts: list[str] = []
        position = 0
        for hit in hits:
            parts.append(text[position : hit.start])
            parts.append(self._render(hit.entity_type, text[hit.start : hit.end]))
            position = hit.end
        parts.append(text[position:])
        return "".join(parts)

    def _render(self, entity: str, value: str) -> str:
        config = self._configs.get(entity)
        if config is None:
            # What presidio's replace operator returns: new_value, or <ENTITY_TYPE> if empty.
            return self._replacements.get(entity) or f"<{entity}>"
        # The engine gets the hit alone: given the whole text it would rebuild it once per
        # hit, quadratic on a large output; mask and hash only ever read the hit's own text.
        span = self._span(entity, 0, len(value), 1.0)
        result = self._engine.anonymize(value, [span], {entity: config})
        return str(result.text)


def _operator_params(spec: OperatorSpec) -> dict[str, Any]:
    if spec.type == "mask":
        return {
            "masking_char": spec.masking_char,
            "chars_to_mask": spec.chars_to_mask,
            "from_end": spec.from_end,
        }
    return {"salt": spec.salt if spec.salt is not None else _PROCESS_SALT}


def _merge(kept: PiiHit, hit: PiiHit) -> PiiHit:
    """One hit covering both: the longer, then the higher-priority, names it."""
    kept_rank = (kept.end - kept.start, -priority(kept.entity_type))
    hit_rank = (hit.end - hit.start, -priority(hit.entity_type))
    winner = kept if kept_rank >= hit_rank else hit
    return PiiHit(winner.entity_type, kept.start, max(kept.end, hit.end))


def resolve_overlaps(hits: Iterable[PiiHit], length: int) -> tuple[PiiHit, ...]:
    """Sorted, non-overlapping hits; overlapping ones merge so no part of either leaks."""
    ordered = sorted(hits, key=lambda h: (h.start, h.start - h.end, priority(h.entity_type)))
    kept: list[PiiHit] = []
    for hit in ordered:
        if not 0 <= hit.start < hit.end <= length:
            raise ValueError(f"the scanner returned a span outside the text: {hit!r}")
        if kept and hit.start < kept[-1].end:
            kept[-1] = _merge(kept[-1], hit)
        else:
            kept.append(hit)
    return tuple(kept)


def _build_scanner(entities: Iterable[str] | None) -> Callable[[str], list[PiiHit]]:
    try:
        return Scanner(entities)
    except ValueError as exc:
        raise PiiBuildError(str(exc)) from exc


class PiiGuard:
    """Scans prompts and tool outputs according to the PII settings."""

    def __init__(
        self, settings: PiiSettings, scanner: Callable[[str], list[PiiHit]] | None = None
    ) -> None:
        """Builds the scanner; raises PiiBuildError with a one-line cause if it cannot.

        `scanner` overrides the built-in one (tests use it to inject a failing scanner).
        Under off nothing is built, so nothing can fail.
        """
        try:
            self._mode = PiiMode(settings.mode)
        except ValueError as exc:  # settings built in code: their types are not checked
            raise PiiBuildError(str(exc)) from exc
        self._scanner: Callable[[str], list[PiiHit]] | None = None
        self._redactor: _Redactor | None = None
        if self._mode is PiiMode.OFF:
            return
        self._scanner = scanner if scanner is not None else _build_scanner(settings.entities)
        if self._mode is PiiMode.REDACT:
            self._redactor = _Redactor(settings.operators)

    @property
    def mode(self) -> PiiMode:
        """The configured mode."""
        return self._mode

    def scan_prompt(self, text: str) -> ScanOutcome:
        """Scan a human prompt: redacted under redact, denied under reject if it has a hit."""
        return self._scan(text, prompt=True)

    def scan_output(self, text: str) -> ScanOutcome:
        """Scan a tool output: redacted under redact, withheld under reject if it has a hit."""
        return self._scan(text, prompt=False)

    def _scan(self, text: str, *, prompt: bool) -> ScanOutcome:
        if self._scanner is None:
            return ScanOutcome(True, text, (), None)
        try:
            hits = resolve_overlaps(self._scanner(text), len(text))
            if hits and self._redactor is not None:
                return ScanOutcome(True, self._redactor(text, hits), hits, None)
        except Exception as exc:  # a scan that fails counts as a hit: nothing unscanned passes
            return self._failed(exc, prompt=prompt)
        if not hits:
            return ScanOutcome(True, text, (), None)
        if prompt:
            return ScanOutcome(False, text, hits, None)
        return ScanOutcome(True, WITHHELD_MESSAGE, hits, None)

    def _failed(self, exc: Exception, *, prompt: bool) -> ScanOutcome:
        cause = f"{type(exc).__name__}: {exc}"
        if len(cause) > _ERROR_LIMIT:
            cause = cause[: _ERROR_LIMIT - 3] + "..."
        allowed = not (prompt and self._mode is PiiMode.REJECT)
        return ScanOutcome(allowed, WITHHELD_MESSAGE, (), cause)
