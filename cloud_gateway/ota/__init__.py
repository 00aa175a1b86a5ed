"""Over-the-air model updates, the publisher's side: signing keys, the signed and
encrypted repository, group keys and enrollment bundles, staged rollouts."""
