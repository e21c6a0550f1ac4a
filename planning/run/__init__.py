"""What a run shares between driver and workers: contracts, names, manifest, progress, cancellation, variables."""
