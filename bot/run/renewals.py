"""What a process's lease renewals say of a store that fails them: one line when they start
failing, one when they work again with what the outage cost, not one per run per renewal."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("kestrel.supervisor")


class RenewalTrouble:
    """The renewals failing now, across the process's runs: which runs, how many, since when."""

    def __init__(self) -> None:
        self._failing: set[str] = set()  # the runs whose last renewal failed
        self._runs: set[str] = set()  # every run that failed one in this outage
        self._failures = 0
        self._since = 0.0

    def failed(self, run_id: str, cause: object) -> None:
        """A renewal of ``run_id`` failed: said if it is the first of an outage."""
        if not self._failing:
            self._runs.clear()
            self._failures, self._since = 0, time.monotonic()
            log.warning(
                "lease renewals fail (%s): trying again at each renewal, said once for every"
                " run until they succeed; a run whose lease runs out meanwhile is adopted",
                cause,
            )
        self._failing.add(run_id)
        self._runs.add(run_id)
        self._failures += 1

    def renewed(self, run_id: str) -> None:
        """A renewal of ``run_id`` worked: the outage's end is said once none fails."""
        if run_id not in self._failing:
            return
        self._failing.discard(run_id)
        if not self._failing:
            log.warning(
                "lease renewals work again, after %d failed renewal(s) of %d run(s) over %.0f s",
                self._failures,
                len(self._runs),
                time.monotonic() - self._since,
            )

    def left(self, run_id: str) -> None:
        """``run_id`` no longer renews (it ended or suspended): an outage it alone was in is
        not waited on to end (the store's own lines say when it answers again)."""
        self._failing.discard(run_id)
