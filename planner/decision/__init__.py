"""The decision: hold gates and rules over per-pool targets, stabilization, the GPU budget."""
