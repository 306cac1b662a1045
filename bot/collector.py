"""The garbage collector as a serving process runs it: what start-up built is kept out of
every pass, and the young generation is passed over less often."""

import gc
from typing import Final

# New objects (net of those freed) before a pass over the young generation; the interpreter's
# default is 700. With a hundred runs in flight, an iteration's objects (coroutines, futures,
# the batch's gate) outlive several hundred of the other runs': at 700 they are walked,
# promoted and walked again before they die; at 10,000 most are freed before any pass.
YOUNG_THRESHOLD: Final = 10_000


def settle_for_service() -> None:
    """Freeze what start-up built, and pass over the young generation only after
    ``YOUNG_THRESHOLD`` new objects (the older generations' thresholds are left as they are)."""
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
