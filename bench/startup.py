"""Start-up time of the command line: whole processes, against the bare interpreter.

Times ``python -c pass``, ``kestrel --help``, ``kestrel runs list`` and ``kestrel runs pending``
as whole processes, round-robin so that a slow spell of the machine hits each alike, on a
small journal (a few runs, one open approval). Prints each one's median wall time and its
difference to the bare interpreter's (target, issue 10: within 150 ms), and which of the slow
imports each command pulled in (read from ``PYTHONPROFILEIMPORTTIME``). ``--breakdown`` also
prints, per command, the import time of each top-level package (the modules' own times summed,
as ``-X importtime`` measures them, so somewhat above their share of a run without it).

    python -m bench.startup [--repeats N] [--json] [--breakdown]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.commits import EXIT_SUSPENDED, clean_environment, kestrel_command, workspace

TARGET_MS: Final = 150.0
REPEATS: Final = 21
# Slow to import, and needed by no read-only command.
HEAVY: Final = (
    "openai",
    "aiohttp",
    "httpx",
    "presidio_anonymizer",
    "mcp",
    "asyncpg",
    "jsonschema",
    "re2",
    "apscheduler",
    "bot.run.supervisor",
    "bot.run.loop",
    "bot.pii.recognizers",
    "pydantic",
    "asyncio",
    "aiosqlite",
    "yaml",
)
BARE: Final = "python -c pass"
COMMANDS: Final = {
    BARE: (),
    "kestrel --help": ("--help",),
    "kestrel runs list": ("runs", "list"),
    "kestrel runs pending": ("runs", "pending"),
}


@dataclass(frozen=True)
class Startup:
    """One command's figures."""

    median_ms: float
    min_ms: float
    over_bare_ms: float
    heavy_imports: list[str]


def command_line(name: str) -> list[str]:
    """The process to start for ``name``."""
    if name == BARE:
        return [sys.executable, "-c", "pass"]
    return [*kestrel_command(), *COMMANDS[name]]


def prepare(folder: Path) -> None:
    """A workspace whose journal holds three runs: two completed, one waiting for approval."""
    workspace(folder)
    env = clean_environment()
    for args, status in (
        (("run", "--defer", "--as", "bob", "restart checkout"), EXIT_SUSPENDED),
        (("run", "--as", "bob", "restart checkout"), 1),  # headless: the gated call is refused
        (("run", "--as", "bob", "restart checkout"), 1),
    ):
        out = subprocess.run(
            [*kestrel_command(), *args], cwd=folder, env=env, capture_output=True, text=True
        )
        if out.returncode not in (0, 1, status):
            raise RuntimeError(f"kestrel {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def timed_environment(folder: Path) -> dict[str, str]:
    """``clean_environment`` with byte code cached, in ``folder``: an inherited
    PYTHONDONTWRITEBYTECODE would keep the warm-up from writing .pyc files, and every timed run
    would compile Kestrel's sources again, which no installed ``kestrel`` does."""
    env = clean_environment()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    return env


def time_once(name: str, folder: Path) -> float:
    """One whole process's wall time, in ms; it must succeed."""
    started = time.perf_counter()
    out = subprocess.run(
        command_line(name),
        cwd=folder,
        env=timed_environment(folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    elapsed = (time.perf_counter() - started) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{out.stderr.decode()[-3000:]}")
    return elapsed


def import_profile(name: str, folder: Path) -> dict[str, int]:
    """The command's own import-time profile: each module's self time in µs."""
    env = timed_environment(folder) | {"PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run(
        command_line(name), cwd=folder, env=env, capture_output=True, text=True, check=False
    )
    profile: dict[str, int] = {}
    for line in out.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and fields[0].strip().isdigit():
            profile[fields[2].strip()] = int(fields[0])
    return profile


def heavy_imports(name: str, folder: Path) -> list[str]:
    """Which of ``HEAVY`` the command imports (its own import-time profile)."""
    imported = import_profile(name, folder)
    return [module for module in HEAVY if module in imported]


def breakdown(name: str, folder: Path, runs: int = 5) -> dict[str, float]:
    """Import time by top-level package (ms, each the median of ``runs`` profiles), largest
    first; Kestrel's own packages are split one level down, by room (``bot.run``)."""
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        totals: dict[str, float] = {}
        for module, micros in import_profile(name, folder).items():
            parts = module.split(".")
            package = ".".join(parts[:2]) if parts[0] in ("bot", "storage") else parts[0]
            totals[package] = totals.get(package, 0.0) + micros / 1000
        for package, ms in totals.items():
            samples.setdefault(package, []).append(ms)
    medians = {package: statistics.median(ms) for package, ms in samples.items()}
    return dict(sorted(medians.items(), key=lambda item: -item[1]))


def measure(repeats: int = REPEATS) -> dict[str, Startup]:
    """Median wall time of each command (ms), its difference to the bare interpreter's, and
    the slow modules it imports."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-startup-") as tmp:
        folder = Path(tmp)
        prepare(folder)
        for name in COMMANDS:
            time_once(name, folder)  # warm the file cache (and .pyc files) first
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(repeats):
            for name in COMMANDS:
                times[name].append(time_once(name, folder))
        heavy = {name: heavy_imports(name, folder) for name in COMMANDS if name != BARE}
    bare = statistics.median(times[BARE])
    return {
        name: Startup(
            median_ms=statistics.median(samples),
            min_ms=min(samples),
            over_bare_ms=statistics.median(samples) - bare,
            heavy_imports=heavy.get(name, []),
        )
        for name, samples in times.items()
    }


def report_breakdown(top: int = 14) -> None:
    """Print each command's slowest packages to import, and what they add up to."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-startup-") as tmp:
        folder = Path(tmp)
        prepare(folder)
        for name in COMMANDS:
            time_once(name, folder)  # .pyc files first
            costs = breakdown(name, folder)
            shown = ", ".join(f"{package} {ms:.0f}" for package, ms in list(costs.items())[:top])
            print(f"  {name:<22} imports {sum(costs.values()):5.0f} ms: {shown}")


def report(repeats: int = REPEATS) -> None:
    """Print the start-up times side by side with their difference to the bare interpreter."""
    figures = measure(repeats)
    print(f"Start-up, whole process, median (min) of {repeats}; target: bare + {TARGET_MS:.0f} ms")
    for name, row in figures.items():
        line = f"  {name:<22} {row.median_ms:7.1f} ms ({row.min_ms:6.1f})"
        if name != BARE:
            verdict = "ok" if row.over_bare_ms <= TARGET_MS else "over"
            heavy = ", ".join(row.heavy_imports) or "none"
            line += f"  {row.over_bare_ms:+7.1f} ms {verdict:<4}  slow imports: {heavy}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description="Start-up time of the kestrel command.")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    parser.add_argument(
        "--breakdown", action="store_true", help="Also print import time by package."
    )
    options = parser.parse_args()
    if options.json:
        figures = measure(options.repeats)
        print(json.dumps({k: dataclasses.asdict(v) for k, v in figures.items()}, indent=2))
    else:
        report(options.repeats)
    if options.breakdown:
        print("Import time by package (ms, -X importtime, median of 5):")
        report_breakdown()


if __name__ == "__main__":
    main()
