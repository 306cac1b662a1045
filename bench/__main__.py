"""``python -m bench``: every workload, one after another, printing its figures.

SQLite first (W1, W2, the PII guard's throughput, what argument provenance costs, the durable
commits of a run waiting for an approval, a first suspend and a resume in fresh processes
beside their floor, the command line's start-up, the Slack and Discord adapters' latencies, a
/metrics scrape, a run's page), then the same on PostgreSQL (``KESTREL_BENCH_POSTGRES_DSN``, a
fresh schema per scenario), two replicas on one store, and the takeover latency. When
PostgreSQL is unreachable its figures are skipped, saying why.
"""

import argparse

from bench import (
    cold,
    commits,
    discord,
    metrics,
    pii_throughput,
    plans,
    provenance,
    replicas,
    slack,
    startup,
    takeover,
    w1,
    w2,
    web,
)
from bench.stores import postgres_server


def sqlite_figures() -> None:
    """W1, W2, the PII guard's throughput, commits per approval, the cold paths, start-up, and
    the Slack and Discord adapters' latencies, on SQLite."""
    w1.report("sqlite")
    print()
    w2.report("sqlite")
    print()
    pii_throughput.main()
    print()
    provenance.report()
    print()
    commits.report()
    print()
    cold.report()
    print()
    plans.report()
    print()
    startup.report()
    print()
    slack.report()
    print()
    discord.report()
    print()
    metrics.report()
    print()
    web.report()


def postgres_figures(server: str) -> None:
    """W1 and W2 on PostgreSQL, two replicas (beside SQLite's), and the takeover latency."""
    print(f"On {server}; each scenario in a fresh schema")
    print()
    w1.report("postgres")
    print()
    w2.report("postgres")
    print()
    replicas.report(("postgres", "sqlite"))
    print()
    takeover.report()


def main() -> None:
    """Print every figure; PostgreSQL's only when its server can be reached."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="One workload alone: python -m bench.NAME (w1, cold, slack...), each with --help.",
    )
    parser.parse_args()
    sqlite_figures()
    print()
    server, problem = postgres_server()
    if problem:
        print(f"PostgreSQL figures skipped: {problem}")
        print()
        replicas.report(("sqlite",))
    else:
        postgres_figures(server)


main()
