"""Tools of the checkout: the sample models' training, the third-party models' fetching,
the face-detector evaluation, the demo. Run from the checkout
(`python tools/NAME.py` or `python -m tools.NAME`), never installed."""
