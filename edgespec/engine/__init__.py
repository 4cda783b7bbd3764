"""The public engine: open a bundle, generate or stream text (engine.py); its results (results.py)."""
from .engine import Engine
from .results import GenerationResult, GenerationStats, Stream

__all__ = ["Engine", "GenerationResult", "GenerationStats", "Stream"]
