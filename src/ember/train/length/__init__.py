"""How long a run trains and when it stops: durations, run length, positions, cadence, signals."""
