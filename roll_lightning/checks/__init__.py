"""Checks a user runs on their own machine: `gpu` (`python bench/gpu_check.py`, on a new GPU machine first) and
the handmade batch it and the tests train on."""
