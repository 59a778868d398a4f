"""The runtime the paper proposes: symmetric-heap transports, ODC primitives, and two
data-parallel engines (on-demand and collective) behind one interface. No Hydra, no pandas."""
