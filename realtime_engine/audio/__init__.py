"""Audio out: resampling, Opus/PCM/mu-law frames, HTTP containers.

Import from the submodules (``encoder``, ``containers``, ...): the package
itself imports nothing, so importing one encoder does not load every native
library (PyAV, soxr). The binary frame header is ``gateway.protocol.frame_header``.
"""
