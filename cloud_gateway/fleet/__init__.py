"""The fleet as the gateway sees it: the devices' telemetry (latest status and a bounded
history, in the state database), the health rule, and the views the dashboard and its
JSON API show."""
