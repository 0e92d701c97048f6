"""`nanoplan prepare-data`: placeholder until its issue lands."""
