"""CLI subcommands, one module each; see edge_runtime/cli.py."""
