"""`nanoplan export`: placeholder until its issue lands."""
