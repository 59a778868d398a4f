"""Data-parallel engines behind one interface (base.py), one record each (registry.py):
`collective` (FSDP2, fsdp2.py) and `odc` (on-demand communication, the odc package)."""
