"""`nanoplan compare`: placeholder until its issue lands."""
