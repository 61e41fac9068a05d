"""`VLLMEngine`: the sampler engine on vLLM; imported on demand (vLLM is an optional
dependency), see docs/engines.md."""
