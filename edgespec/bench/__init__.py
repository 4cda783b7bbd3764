"""`edgespec bench`: running the modes side by side (run), the report (report), the plot (plot) and
the board projection (projection)."""
