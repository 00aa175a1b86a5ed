"""The OTA wire format, shared by the publisher (gateway) and the updater (device).

- :mod:`.crypto`: the encrypted blob (AES-256-GCM chunks) and key wrapping (X25519,
  HKDF); pure;
- :mod:`.plan`: the gateway's unsigned plan, read strictly, the model-name rule and
  target paths; pure.
"""
