"""A trivial Flower app: Flower's own seconds per message exchange."""
