"""edge_core: what the device and the gateway share, and nothing else.

The error tree and its one status table (:mod:`.errors`, :mod:`.status`),
typed reading of configuration files (:mod:`.fields`), the tensor vocabulary
(:mod:`.tensors`), the model-package format (:mod:`.package`), the Open
Inference Protocol's codecs (:mod:`.protocol`), the runtimes (:mod:`.runtime`),
the OTA wire format (:mod:`.ota`), TLS and MQTT settings and the MQTT client
(:mod:`.tls`, :mod:`.mqtt`), the command runner (:mod:`.cli`) and the
benchmarks' report helpers (:mod:`.report`).

``edge_agent`` (the device) and ``cloud_gateway`` (the cloud) both import it;
it imports neither, and they never import each other (an import contract in
``pyproject.toml``, checked by ``make lint``). Importing this package loads
nothing but itself: each module is imported where it is used.
"""

# the release of all three packages (one wheel): pyproject.toml reads it here
__version__ = "0.3.0"
