"""``make demo``: the sample models, then a cloud gateway and an edge agent on loopback.

Everything runs in a temporary folder that is removed at the end (also after
an error, Ctrl-C or SIGTERM), with the embedded defaults: the built-in
policy, the sample models, generated inputs, no broker needed.

1. The sample models (:mod:`.variants`): one held-out digit, saved as a
   64x64 picture, through each committed variant of ``digits-light`` and
   ``digits-heavy``, and a photo through BlazeFace when it has been fetched,
   as ``edge-agent infer --variant`` reads and runs them; a table of each
   variant's answer and latency.
2. The operator (``cloud-gateway`` commands, :mod:`.loopback` from here on):
   signing keys, two cameras of the group ``demo`` enrolled, ``digits-light``
   v1 published to the signed OTA repository; the gateway serves the
   cloud-only models ``digits-heavy`` and ``ppocr-det`` over REST and gRPC,
   and the OTA repository. When ``mosquitto`` is installed (and
   ``--no-mqtt`` is not given) a broker joins, with the password and ACL
   files of ``cloud-gateway mqtt acl``, and the gateway bridges it.
3. The device: ``edge-agent run`` (the systemd service) as ``cam-01`` on a
   simulated Raspberry Pi 5 (a fake ``/proc`` and ``/sys``: its profile is
   detected and nothing on this machine is touched). It says ``READY=1`` on a
   ``NOTIFY_SOCKET``, as it would to systemd. With MQTT it sends telemetry
   and hears rollout announcements; without, it checks for updates every 2 s.
4. Requests through the agent's local Open Inference Protocol API (HTTP), one
   per decision of the policy: a digit the light model is sure of (LOCAL),
   one it is unsure of (escalated to the cloud's heavy model), the same
   labelled ``sensitive`` (it stays), a ``personal`` digit and a photo with a
   face for cloud-only models (OFFLOAD_REDACTED), a ``sensitive`` digit for a
   cloud-only model (REJECT, 403).
5. ``digits-light`` v2 is published and rolled out to the group; the agent
   installs it (verified, decrypted, smoke-tested, swapped in) and answers
   with it.
6. The gateway stops: the light model stands in for the cloud's, the answers
   marked degraded (LOCAL_DEGRADED).
7. A summary table: each request's decision, reason, where it was answered
   and its latency; the model's version before and after; MQTT on or off.

Usage, from the repository's root: ``python -m tools.demo [--no-mqtt]``.
"""
