"""The `ovq` command: starts the tiers as separate processes (it imports neither)."""
