"""What a run's driver and workers share: contracts, names, manifest, progress, cancellation, variables, disk."""
