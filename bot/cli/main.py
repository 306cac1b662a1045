"""The ``kestrel`` script: start-up kept from the collector, then the command line."""

import sys

from bot.collector import hold_during_start_up


def main() -> None:
    """Entry point of the ``kestrel`` script."""
    # Before the imports: click and Kestrel's modules are start-up too (bot.collector).
    hold_during_start_up()
    from bot.cli import decisions

    if decisions.answered(sys.argv[1:]):
        from bot.cli.common import exit_at_once

        exit_at_once(0)
    from bot.cli.commands import cli

    cli(obj={}, prog_name="kestrel")
