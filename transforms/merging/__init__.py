"""The statistics' internals: their merge in a fixed tree of units, groups and branches."""
