"""Tools: the protocol, the immutable tool set, command and in-process tools, catalogs."""
