"""Training: the model zoo and model files, compile/evaluate/export, learning-rate schedules, and
backup/resume of interrupted runs."""
