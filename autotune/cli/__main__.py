"""`python -m autotune.cli`, as the `autotune` script."""

from autotune.cli import main

main()
