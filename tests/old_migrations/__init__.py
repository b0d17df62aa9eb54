"""The migration history before the squash, kept only for tests/services/test_migration_squash.py."""
