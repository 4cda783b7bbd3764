"""edgespec: speculative decoding for LLMs on edge devices, on onnxruntime."""
__version__ = "0.1.0"
