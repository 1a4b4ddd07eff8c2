"""Building a run: the `LearnerBuilder`, its options, their checks and resolution."""
