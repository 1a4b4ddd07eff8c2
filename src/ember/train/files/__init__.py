"""The run's files: the artifact directory, metric files, run records, the lock, the model summary."""
