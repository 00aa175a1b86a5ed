"""The fleet dashboard: server-rendered pages under ``/ui`` and the JSON API under
``/api`` that they stand on, for admin tokens (see :mod:`.web` and :mod:`.api`)."""
