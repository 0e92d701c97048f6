"""nanoplan runner: the torch training core."""
