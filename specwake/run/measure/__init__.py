"""Measuring a running server: cycles, stages, counters. May import prepare/, judge/; not report/, run/'s others."""
