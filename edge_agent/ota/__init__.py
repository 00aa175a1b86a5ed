"""Over-the-air model updates, the device's side.

The wire format (the encrypted blob, key wrapping, the plan, the model-name rule
and target paths) is shared with the publisher: :mod:`edge_core.ota`.

- :mod:`.bundle`: the enrollment bundle;
- :mod:`.signed`: the signed metadata through python-tuf (withdrawals, key files);
- :mod:`.fetch`: the plan with a size cap, blobs with resume and a length limit;
- :mod:`.store`: A/B slots with an atomic switch, an inter-process lock; decryption
  into memory;
- :mod:`.smoke`: the smoke test of a new model;
- :mod:`.install`: one version's install (key, download, verify, smoke-test, write, switch);
- :mod:`.updater`: the workflow (check, verify, smoke-test, install, switch, report).
"""

from edge_agent.ota.bundle import Enrollment, load_bundle
from edge_agent.ota.store import OtaStore, SlotInfo
from edge_agent.ota.updater import OtaUpdater, UpdateOutcome, smoke_test

__all__ = [
    "Enrollment",
    "OtaStore",
    "OtaUpdater",
    "SlotInfo",
    "UpdateOutcome",
    "load_bundle",
    "smoke_test",
]
