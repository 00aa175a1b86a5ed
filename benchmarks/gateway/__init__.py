"""The gateway's benchmarks: its two limits (:mod:`~benchmarks.gateway.limits`), a
remote engine behind it (:mod:`~benchmarks.gateway.remote`, with a bare relay for the
floor, :mod:`~benchmarks.gateway.relay`), a simulated fleet of devices
(:mod:`~benchmarks.gateway.fleet`) and its dashboard
(:mod:`~benchmarks.gateway.dashboard`)."""
