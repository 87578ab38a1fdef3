"""The front door (``reconciler door``): one OpenAI endpoint for the host, routing each request by its ``model`` (a
served name or an alias) to the lane that serves it, holding it while that lane enters, wakes, sleeps or is about to
leave, and streaming the answer back as it comes (docs/design.md, the front door).

A front-end standing on the service layer, like the command line, the HTTP API and MCP, and never on them: it learns
the host's state through ``reconciler.service.door_view`` and changes the host only through the service's calls.
``app`` (the ASGI app and the proxy), ``hold`` (the held requests), ``metrics`` (its own /metrics) and ``run`` (the
process: its look at the host, the published counts for the drain, uvicorn).
"""
