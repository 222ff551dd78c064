"""Benchmarks: commands that print a table and write JSON; they are not tests."""
