"""Throughput of the PII guard on a deterministic mixed log corpus (python -m bench.pii_throughput).

The corpus imitates what tools hand back in chat-ops: application log lines, JSON logs,
access logs, Python and Java stack traces, kubectl tables and HTTP dumps, full of the
near-misses that make log text hard (timestamps, versions, ports, PIDs, UUIDs, epoch
milliseconds, snowflake ids, digests), with PII and secrets sprinkled at a low rate.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import string
import time
from collections import Counter
from collections.abc import Callable

from bot.pii.guard import PiiGuard, PiiMode, PiiSettings

_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARN", "ERROR")
_LOGGERS = (
    "kestrel.loop",
    "app.api.orders",
    "sqlalchemy.engine",
    "uvicorn.access",
    "celery.worker",
    "com.example.billing.InvoiceService",
    "k8s.io/client-go",
)
_PATHS = (
    "/api/v1/orders",
    "/api/v1/users/{id}",
    "/healthz",
    "/metrics",
    "/api/v2/invoices/{id}/lines",
    "/static/app.3f9a1c.js",
)
_HOSTS = ("db-primary.internal", "cache-01", "api.example.com", "queue.svc.cluster.local")
_WORDS = (
    "request completed",
    "connection pool exhausted, retrying",
    "cache miss for key",
    "scheduled job finished",
    "slow query detected",
    "upstream responded",
    "rebalancing partitions",
    "checkpoint written",
    "lease renewed",
    "garbage collection pause",
)
_UAS = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0",
    "curl/8.5.0",
    "python-httpx/0.27.0",
    "kube-probe/1.29",
)

_B64URL = string.ascii_letters + string.digits + "-_"
_ALNUM = string.ascii_letters + string.digits


def _token(rng: random.Random, length: int, alphabet: str = _ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(length))


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _iso(rng: random.Random) -> str:
    return (
        f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
        f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z"
    )


def _luhn_complete(prefix: str, length: int, rng: random.Random) -> str:
    body = prefix + "".join(str(rng.randint(0, 9)) for _ in range(length - len(prefix) - 1))
    total = 0
    for index, char in enumerate(reversed(body)):
        digit = int(char)
        if index % 2 == 0:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return body + str((10 - total % 10) % 10)


def _iban(rng: random.Random) -> str:
    bban = "37040044" + "".join(str(rng.randint(0, 9)) for _ in range(10))
    check = 98 - int(bban + "131400") % 97
    return f"DE{check:02d}{bban}"


def _jwt(rng: random.Random) -> str:
    def seg(obj: dict[str, object]) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    payload = {"sub": str(rng.randint(1, 10**6)), "iat": 1714567890, "role": "admin"}
    return f"{seg({'alg': 'HS256', 'typ': 'JWT'})}.{seg(payload)}.{_token(rng, 43, _B64URL)}"


def _sensitive(rng: random.Random) -> str:
    """One piece of PII or one secret, in the context it is usually found in."""
    choices: tuple[Callable[[], str], ...] = (
        lambda: f"notify {rng.choice(('alice', 'bob.smith', 'ops+alerts'))}@example.com",
        lambda: f"callback +44 20 7946 {rng.randint(1000, 9999)}",
        lambda: f"phone: ({rng.randint(201, 989)}) 555-{rng.randint(1000, 9999)}",
        lambda: f"card={_luhn_complete('4', 16, rng)}",
        lambda: f"iban {_iban(rng)}",
        lambda: f"ssn {rng.randint(100, 665)}-{rng.randint(10, 99)}-{rng.randint(1000, 9999)}",
        lambda: f"AWS_ACCESS_KEY_ID=AKIA{_token(rng, 16, string.ascii_uppercase + '234567')}",
        lambda: f"aws_secret_access_key = {_token(rng, 40, _ALNUM + '/+')}",
        lambda: f"token ghp_{_token(rng, 36)}",
        lambda: f"SLACK_BOT_TOKEN=xoxb-{rng.randint(10**11, 10**12)}-{_token(rng, 24)}",
        lambda: f"OPENAI_API_KEY=sk-proj-{_token(rng, 64, _B64URL)}",
        lambda: f"stripe key sk_live_{_token(rng, 24)}",
        lambda: f"maps key AIza{_token(rng, 35, _B64URL)}",
        lambda: f"Authorization: Bearer {_jwt(rng)}",
        lambda: f"DATABASE_URL=postgres://app:{_token(rng, 12)}@{rng.choice(_HOSTS)}:5432/app",
        lambda: f"Server=db;Database=app;User Id=sa;Password={_token(rng, 14)};",
        lambda: f"client {rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.7",
    )
    return rng.choice(choices)()


def _app_line(rng: random.Random) -> str:
    path = rng.choice(_PATHS).replace("{id}", str(rng.randint(1, 99999)))
    return (
        f"{_iso(rng)} {rng.choice(_LEVELS):5} [worker-{rng.randint(1, 16)}] "
        f"{rng.choice(_LOGGERS)} - {rng.choice(_WORDS)} path={path} "
        f"status={rng.choice((200, 200, 201, 204, 404, 500))} "
        f"latency_ms={rng.uniform(0.1, 900):.2f} "
        f"pid={rng.randint(1000, 65000)} request_id={_uuid(rng)}"
    )


def _json_line(rng: random.Random) -> str:
    record = {
        "ts": 1714567890123 + rng.randint(0, 10**9),
        "level": rng.choice(_LEVELS).lower(),
        "msg": rng.choice(_WORDS),
        "trace_id": f"{rng.getrandbits(128):032x}",
        "span_id": f"{rng.getrandbits(64):016x}",
        "duration": round(rng.uniform(0, 5), 6),
        "host": rng.choice(_HOSTS),
        "port": rng.choice((5432, 6379, 8080, 443)),
        "guild_id": str(rng.randint(1_100_000_000_000_000_000, 1_300_000_000_000_000_000)),
        "version": f"{rng.randint(0, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 99)}",
    }
    return json.dumps(record)


def _access_line(rng: random.Random) -> str:
    ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    return (
        f"{ip} - - [01/May/2024:{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
        f'{rng.randint(0, 59):02d} +0000] "GET {rng.choice(_PATHS)} HTTP/1.1" '
        f'{rng.choice((200, 304, 404))} {rng.randint(0, 99999)} "-" "{rng.choice(_UAS)}"'
    )


def _python_trace(rng: random.Random) -> str:
    frames = [
        f'  File "/usr/lib/python3.11/site-packages/app/{name}.py", line {rng.randint(1, 2000)}, '
        f"in {name}_handler\n    result = await self._call({name}, timeout={rng.randint(1, 60)})"
        for name in rng.sample(("orders", "billing", "auth", "db", "cache", "queue"), 4)
    ]
    return (
        "Traceback (most recent call last):\n"
        + "\n".join(frames)
        + (f"\nTimeoutError: operation timed out after {rng.uniform(1, 30):.3f}s")
    )


def _java_trace(rng: random.Random) -> str:
    frames = [
        f"\tat com.example.{pkg}.{cls}.{meth}({cls}.java:{rng.randint(10, 900)})"
        for pkg, cls, meth in rng.sample(
            [
                ("billing", "InvoiceService", "render"),
                ("db", "ConnectionPool", "acquire"),
                ("http", "Router", "dispatch"),
                ("core", "Worker", "run"),
                ("util", "Retry", "call"),
            ],
            4,
        )
    ]
    head = f"java.lang.IllegalStateException: pool exhausted (size={rng.randint(1, 64)})"
    return head + "\n" + "\n".join(frames) + "\n\t... 12 more"


def _kubectl_line(rng: random.Random) -> str:
    pod = f"api-{_token(rng, 9, string.ascii_lowercase + string.digits)}-{_token(rng, 5)}"
    return (
        f"{pod.lower():<32} 1/1     Running   {rng.randint(0, 5):<9} {rng.randint(1, 40)}d"
        f"{rng.randint(0, 23)}h   sha256:{rng.getrandbits(256):064x}"
    )


def _http_dump(rng: random.Random) -> str:
    return (
        f"> GET {rng.choice(_PATHS)} HTTP/1.1\n> Host: {rng.choice(_HOSTS)}\n"
        f"> User-Agent: {rng.choice(_UAS)}\n> Accept: application/json\n"
        f"< HTTP/1.1 200 OK\n< Content-Length: {rng.randint(10, 99999)}\n"
        f"< Date: Wed, 01 May 2024 12:{rng.randint(10, 59)}:{rng.randint(10, 59)} GMT\n"
        f"< X-Request-Id: {_uuid(rng)}"
    )


_GENERATORS: tuple[tuple[Callable[[random.Random], str], int], ...] = (
    (_app_line, 40),
    (_json_line, 25),
    (_access_line, 5),
    (_python_trace, 3),
    (_java_trace, 3),
    (_kubectl_line, 15),
    (_http_dump, 2),
)


def build_corpus(size: int, seed: int = 20240501, pii_rate: float = 0.004) -> str:
    """A deterministic corpus of about `size` characters; `pii_rate` is per line."""
    rng = random.Random(seed)
    makers = [maker for maker, _ in _GENERATORS]
    weights = [weight for _, weight in _GENERATORS]
    parts: list[str] = []
    total = 0
    while total < size:
        piece = rng.choices(makers, weights)[0](rng)
        if rng.random() < pii_rate:
            piece = f"{piece} {_sensitive(rng)}"
        parts.append(piece)
        total += len(piece) + 1
    return "\n".join(parts)


def split_chunks(corpus: str, chunk: int) -> list[str]:
    """Cut the corpus at line ends into pieces of about `chunk` characters (0: one piece)."""
    if chunk <= 0:
        return [corpus]
    chunks: list[str] = []
    start = 0
    while start < len(corpus):
        end = corpus.find("\n", start + chunk)
        end = len(corpus) if end < 0 else end + 1
        chunks.append(corpus[start:end])
        start = end
    return chunks


def measure(guard: PiiGuard, chunks: list[str], repeat: int) -> tuple[float, Counter[str]]:
    """Median seconds of scanning every chunk once, and the hits found per entity type."""
    timings: list[float] = []
    hits: Counter[str] = Counter()
    for _ in range(repeat):
        hits = Counter()
        started = time.perf_counter()
        for text in chunks:
            outcome = guard.scan_output(text)
            hits.update(hit.entity_type for hit in outcome.hits)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), hits


def main() -> None:
    """Build the corpus, scan it in redact mode and print MB/s."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=float, default=10.0)
    parser.add_argument("--chunk-kib", type=int, default=64, help="tool output size; 0 = one text")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20240501)
    args = parser.parse_args()
    corpus = build_corpus(int(args.size_mb * 1_000_000), args.seed)
    chunks = split_chunks(corpus, args.chunk_kib * 1024)
    guard = PiiGuard(PiiSettings(mode=PiiMode.REDACT))
    seconds, hits = measure(guard, chunks, args.repeat)
    megabytes = len(corpus.encode()) / 1_000_000
    print(f"corpus: {megabytes:.2f} MB in {len(chunks)} chunk(s) of ~{args.chunk_kib} KiB")
    print(f"scan_output (redact): {seconds * 1000:.1f} ms median of {args.repeat}")
    print(f"throughput: {megabytes / seconds:.1f} MB/s")
    print(f"hits: {sum(hits.values())} " + " ".join(f"{k}={v}" for k, v in sorted(hits.items())))


if __name__ == "__main__":
    main()
