"""Fixtures the tests share, kept out of the product: the OTA test world, a test
broker with fault controls, child-process scripts, fakes at our own seams."""
