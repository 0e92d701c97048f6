"""`nanoplan validate`: placeholder until its issue lands."""
