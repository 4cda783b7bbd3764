"""The command line: `edgespec` (main) and one module per subcommand (commands/)."""
