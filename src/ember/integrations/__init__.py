"""Integrations with other tools, each imported only when used (`ember.integrations.optuna`)."""
