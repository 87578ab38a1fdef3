"""The base: standard library only (units, redaction, strict JSON, safe files, mounts, sd_notify, errors, and the
request contract every front-end checks its requests by, ``requests``)."""
