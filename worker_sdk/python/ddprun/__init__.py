"""ddprun's worker-side Python package.

Submodules are imported on use and import nothing heavy here:
    import ddprun.checkpoint   # checkpoints in memory owned by the agent
"""
