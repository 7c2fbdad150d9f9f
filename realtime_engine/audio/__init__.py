"""Audio out: resampling, Opus/PCM/mu-law frames, the binary frame header, HTTP containers.

Import from the submodules (``encoder``, ``containers``, ``frame_header``, ...):
the package itself imports nothing, so the client SDK can use the frame header
without the encoders' native libraries (PyAV, soxr).
"""
