"""For the migration tests: move the test database to a migration and back to the latest."""
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(targets: list[tuple[str, str]]) -> Apps:
    """Migrate to `targets`; the historical models there (get_model on what this returns)."""
    MigrationExecutor(connection).migrate(targets)
    return MigrationExecutor(connection).loader.project_state(targets).apps


def migrate_to_latest() -> Apps:
    """Every migration applied: the test database is left as the other tests expect it."""
    return migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
