"""Hostile load against a job: ``load``, a caller's streams written from the protocols alone."""
