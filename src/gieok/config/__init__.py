"""Settings from `GIEOK_*` environment variables and an optional `gieok.toml`, parsed and checked
once (`settings.py`: the mechanism and the engine's section), with the parsers of multi-valued
settings in `values.py`. The chat's and the server's sections extend `Settings` in their rings."""

from .files import read_text_file
from .settings import Settings, default_db_path, load_settings

__all__ = ["Settings", "load_settings", "default_db_path", "read_text_file"]
