"""What the built-in tasks share: splits, graded levels, episode plumbing (see `tasks`)."""
