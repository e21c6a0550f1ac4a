"""What the input files hold, learnt on the driver: probes, inventory and its cache, members, times, coordinates."""
