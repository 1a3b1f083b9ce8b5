"""Forwards the routing checker still judges wrongly (RCK-85, owed)."""
