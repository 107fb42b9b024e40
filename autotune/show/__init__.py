"""What people read: terminal tables, the HTML report, optuna-dashboard and the exported configuration."""
