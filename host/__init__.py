"""The composition of the server, above everything else: the ASGI app (every transport's routes,
health, metrics, HTTP control, the demo page), the uvicorn runner, and the ``realtime-omni``
command (serve, models). Nothing imports this package, and it imports no bench."""
