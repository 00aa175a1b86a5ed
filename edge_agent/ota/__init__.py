"""Over-the-air model updates, the device's side.

- :mod:`.crypto`: the encrypted blob and key wrapping (pure; shared with the publisher);
- :mod:`.bundle`: the enrollment bundle;
- :mod:`.fetch`: metadata through python-tuf, blobs with resume and a length limit;
- :mod:`.store`: A/B slots with an atomic switch; decryption into memory;
- :mod:`.updater`: the workflow (check, verify, install, smoke-test, switch, report).
"""

from edge_agent.ota.bundle import Enrollment, load_bundle
from edge_agent.ota.store import OtaStore, SlotInfo
from edge_agent.ota.updater import OtaUpdater, UpdateOutcome, UpdateSettings, smoke_test

__all__ = [
    "Enrollment",
    "OtaStore",
    "OtaUpdater",
    "SlotInfo",
    "UpdateOutcome",
    "UpdateSettings",
    "load_bundle",
    "smoke_test",
]
