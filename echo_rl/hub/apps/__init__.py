"""One-line training apps: ``python -m echo_rl.hub.apps.<algo>_<suite> --env-id ...``."""
