"""Inference: the built-in transformers engine, the vLLM adapter, renderers and the HTTP service.

Submodules are imported by what they do (`engine`, `server`, `renderer`, `weights`,
`vllm_backend`, ...); importing this package loads none of them, so neither torch nor vLLM
is paid for by code that only needs the request types in `api`.
"""
