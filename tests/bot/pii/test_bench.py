"""The throughput benchmark's corpus: deterministic, sized, and carrying what it should."""

from __future__ import annotations

from bench.pii_throughput import build_corpus, measure, split_chunks
from bot.pii.guard import PiiGuard, PiiSettings


def test_corpus_is_deterministic_and_sized() -> None:
    corpus = build_corpus(200_000)
    assert corpus == build_corpus(200_000)
    assert corpus != build_corpus(200_000, seed=7)
    assert 200_000 <= len(corpus) < 205_000


def test_chunks_cut_at_line_ends_and_cover_the_corpus() -> None:
    corpus = build_corpus(100_000)
    chunks = split_chunks(corpus, 4096)
    assert "".join(chunks) == corpus
    assert all(chunk.endswith("\n") for chunk in chunks[:-1])
    assert split_chunks(corpus, 0) == [corpus]


def test_measure_counts_the_sprinkled_data() -> None:
    chunks = split_chunks(build_corpus(300_000, pii_rate=0.2), 16_384)
    seconds, hits = measure(PiiGuard(PiiSettings()), chunks, repeat=1)
    assert seconds > 0
    assert {"EMAIL_ADDRESS", "CREDIT_CARD", "IBAN_CODE", "JWT", "US_SSN"} <= set(hits)
