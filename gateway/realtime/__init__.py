"""The realtime WebSocket API: session state machine, contexts, pipeline, outbound queue."""
