"""The agent as a systemd service.

``notify`` speaks systemd's notify protocol (readiness, status, reloads, the
watchdog) so that ``Type=notify`` knows when the agent is ready and restarts
it when it wedges; ``unit`` renders and installs the ``edge-agent.service``
unit (template in ``edge-agent.service`` beside this file) for
``edge-agent service install``. Submodules are imported where used, so the
CLI does not pay for the daemon and the daemon not for the installer.
"""
