"""What a person reads: comparison tables, the experiment report, plots, MLflow tracking."""
