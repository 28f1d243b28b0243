"""`python -m specwake.cli`, as the `specwake` script runs it."""

from specwake.cli import main

main()
