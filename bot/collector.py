"""The garbage collector as ``kestrel`` runs it: no pass during start-up, what start-up built
kept out of every later pass, and (serving) the young generation passed over less often."""

import gc
from typing import Final

# New objects (net of those freed) before a pass over the young generation; the interpreter's
# default is 700. With a hundred runs in flight, an iteration's objects (coroutines, futures,
# the batch's gate) outlive several hundred of the other runs': at 700 they are walked,
# promoted and walked again before they die; at 10,000 most are freed before any pass.
YOUNG_THRESHOLD: Final = 10_000
# Whether this process held its start-up (the ``kestrel`` script does), and has not settled yet.
_held = False


def hold_during_start_up() -> None:
    """No pass until ``settle_after_start_up``: start-up builds what lives as long as the
    process (modules, classes, settings, the catalog), none of it garbage, and the passes over
    it took a tenth of ``kestrel runs approve`` (bench.cold). A command that builds no runtime
    and opens no store (``--help``, ``runs list``'s fast way, ``tools check``) is short, and
    keeps the collector held to its end."""
    global _held
    _held = True
    gc.disable()


def settle_after_start_up() -> None:
    """If start-up was held: keep what it built out of every later pass (to the process's end:
    unfrozen, the interpreter's exit walked it all again, 15 ms of ``runs approve``), and let
    the passes run again. A process that held nothing (a test calling a command) is left as
    it is, its collector on or off."""
    global _held
    if not _held:
        return
    _held = False
    gc.freeze()
    gc.enable()


def settle_for_service() -> None:
    """Keep what start-up built out of every later pass, and pass over the young generation
    only after ``YOUNG_THRESHOLD`` new objects (the older generations' thresholds are left as
    they are)."""
    gc.freeze()
    gc.enable()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
