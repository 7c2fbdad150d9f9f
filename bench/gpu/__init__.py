"""Scripts for the benchmark runs on the GPU machine (see README.md here)."""
