"""TTS plug-ins for voice-agent frameworks, thin adapters over ``gateway.client``.

- ``gateway.integrations.pipecat``: ``GatewayTTSService`` (extra ``[pipecat]``)
- ``gateway.integrations.livekit``: ``GatewayTTS`` (extra ``[livekit]``)

Each module imports its framework, so import only the one you use.
"""
