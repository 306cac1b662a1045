"""Cron expressions, parsed by APScheduler's trigger."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger


def parse_cron(expression: str) -> CronTrigger:
    """A crontab expression in UTC: five fields, or six with seconds first; ValueError naming
    the problem."""
    from apscheduler.triggers.cron import CronTrigger  # only where schedules are used

    fields = expression.split()
    try:
        if len(fields) == 6:
            second, minute, hour, day, month, weekday = fields
            trigger = CronTrigger(
                second=second,
                minute=minute,
                hour=hour,
                day=day,
                month=month,
                day_of_week=weekday,
                timezone="UTC",
            )
        else:
            trigger = CronTrigger.from_crontab(expression, timezone="UTC")
    except ValueError as exc:
        raise ValueError(f"cron {expression!r}: {exc}") from exc
    # A day no month has (30 February, 31 April) parses, and would never fire, unsaid.
    if trigger.get_next_fire_time(None, datetime.now(UTC)) is None:
        raise ValueError(f"cron {expression!r}: never fires (no date matches it)")
    return trigger


def cron_fields(expression: str) -> str:
    """``expression``'s fields one space apart: two expressions spaced apart alike are one
    schedule."""
    return " ".join(expression.split())
