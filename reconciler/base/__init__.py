"""The base: standard library only (units, redaction, strict JSON, safe files, mounts, sd_notify, errors)."""
