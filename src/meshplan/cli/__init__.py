"""meshplan command line (typer + rich); entry point ``meshplan.cli.app:main``."""
