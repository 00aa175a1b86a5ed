"""The gateway's MQTT side: the bridge (:mod:`.bridge`) and the broker's access
files (:mod:`.broker`)."""
