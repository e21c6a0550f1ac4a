"""The shard writer's internals: bucket blobs (what a unit sends a shard) and their merge in shuffle-key order."""
