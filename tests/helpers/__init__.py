"""Helpers shared by several test modules (tests never import from each other)."""
