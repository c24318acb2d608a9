"""One thin entry point per DVC stage: `python -m stages.<name> --help`."""
