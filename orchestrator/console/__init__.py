"""What distrun shows a person: the one terminal writer, host ranges folded as clush folds them, and
signal handlers for a block of work."""
