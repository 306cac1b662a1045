"""Settings: typed structs over their sources (the YAML file, ``./.env``, the environment)."""
