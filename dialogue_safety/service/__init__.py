"""HTTP serving: settings, limits, the micro-batcher, the API, auth, telemetry, hot swap and the server."""
