"""CLI commands, one module per area; `rlbus.cli` assembles them."""
