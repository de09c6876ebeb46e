"""When each run leaves Redis, as ``runner runs`` shows it (its ``expires`` column).

Apart from :mod:`runner.cli.retain` so listing runs loads no other command's module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from runner.store.expiry import RetainingStore
from runner.store.models import RunInfo
from runner.store.policy import EXPIRING


def expiry_texts(store: object, infos: Sequence[RunInfo]) -> dict[str, str]:
    """What ``runner runs`` shows in its ``expires`` column for each run."""
    if not isinstance(store, RetainingStore):
        return {}
    from .render import stamp

    found = store.expiries([i.run_id for i in infos])
    texts = {}
    for info in infos:
        seen = found[info.run_id]
        if seen.pinned:
            texts[info.run_id] = "pinned"
        elif info.status.value not in EXPIRING:
            texts[info.run_id] = "-"
        elif seen.expires_at is None:
            texts[info.run_id] = "next pass"  # ended: the next retention pass decides
        else:
            texts[info.run_id] = "never" if math.isinf(seen.expires_at) else stamp(seen.expires_at)
    return texts
