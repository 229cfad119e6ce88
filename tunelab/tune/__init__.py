"""Tune: the largest and fastest micro batch by real probes (tune-batch), tuning studies and their reports."""
