"""Symmetric-heap transports: one protocol (base.py), one record per implementation (registry.py)."""
