"""Decode rounds: their shape and launch queue, phase timing, start-up warm-up, mixed-phase iterations."""
