"""The HTTP server (OpenAI-compatible) and its systemd integration."""
