"""The OpenAI-compatible HTTP API: speech, voices, errors."""
