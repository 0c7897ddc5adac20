"""`python -m ddprun ARGS...` runs the wheel's `ddprun ARGS...` (same command line)."""
from ddprun._launch import ddprun

if __name__ == "__main__":
    ddprun()
