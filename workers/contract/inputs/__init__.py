"""Reading what a user names, bounded and safely: small JSON files (jsonfile), only regular files (regular_file),
and the hosts a URL may reach (host_rule)."""
