"""Over-the-air model updates, the device's side.

- :mod:`.crypto`: the encrypted blob and key wrapping (pure; shared with the publisher);
- :mod:`.plan`: the gateway's unsigned plan, read strictly, and the model-name rule
  and target paths (pure; shared with the publisher);
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
