"""Static checks that load no weights: `diag lint` and `diag validate`."""
