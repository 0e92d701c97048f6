"""`nanoplan calibrate`: placeholder until its issue lands."""
