"""`--resume`: start again, at most once and never over a person, a turn a crash interrupted."""
