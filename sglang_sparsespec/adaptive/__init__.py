"""Adaptive speculation: how many drafts each round runs, priced from measured costs and acceptance."""
