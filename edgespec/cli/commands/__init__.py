"""One module per `edgespec` subcommand; each defines `register(subparsers)`."""
