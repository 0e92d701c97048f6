"""A stand-in for the torchtitan package (tests only): `python -m torchtitan.train` runs train.py here when
this directory comes first on PYTHONPATH. See train.py."""
