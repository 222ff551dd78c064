"""Settings from `GIEOK_*` environment variables and an optional `gieok.toml`, parsed and
checked once (`settings.py`), with the parsers of multi-valued settings in `values.py`."""

from .files import read_text_file
from .settings import Settings, default_db_path, load_settings
from .values import ChainEntry, parse_chain

__all__ = ["Settings", "load_settings", "default_db_path", "ChainEntry", "parse_chain", "read_text_file"]
