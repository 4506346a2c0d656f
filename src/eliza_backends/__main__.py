"""``python -m eliza_backends`` runs the CLI."""

from .cli import main

raise SystemExit(main())
