"""The speculative loop itself: one model on an in-place KV cache (runner), sampling, one round
(speculative), what steps cost (costmodel), and text in/out (detokenize, chat templates)."""
