"""Settings: validated (pydantic) over their sources (the YAML file, ./.env, the environment)."""
