"""`nanoplan run`: placeholder until its issue lands."""
