"""Loading the operator's files into the model, with errors that name the file, the line, the field and the fix.

A docstring only, no facade: importers name the module. ``desired`` loads the whole desired state (``host_file``,
``recipes`` and the manifests, read against each other by ``cross_checks``); ``files``, ``yaml_source``,
``toml_source`` and ``problems`` read text safely and find a field's line; ``tmpfs`` examines shm.dir; ``secrets``
resolves recipes' secret env values; ``file_schema`` generates the published JSON Schemas.
"""
