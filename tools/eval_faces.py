"""Measure face detectors' recall, false alarms and time; the eval behind the default.

The same as ``python -m benchmarks privacy`` (:mod:`benchmarks.agent.faces` and
:mod:`benchmarks.agent.privacy_video`): every detector configuration on the
same synthetic scenes (faces of 24 to 192 px under eight distortions, a few to
a 640x480 scene) and the twenty face-free scikit-image photographs, then
``redact`` on a video it writes. Prints the tables and writes JSON::

    python tools/eval_faces.py --json bench-results/faces.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.__main__ import main as benchmarks

if __name__ == "__main__":
    raise SystemExit(benchmarks(["privacy", *sys.argv[1:]]))
