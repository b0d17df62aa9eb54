from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "EAGLE-3 runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The higher domains listen to what the lower ones announce (runs/pipeline/lifecycle/signals.py,
        # runs/tracking/signals.py), so that no lower domain imports a higher one
        # (tests/house/test_runs_layers.py).
        from runs.alerts import receivers as alert_receivers
        from runs.sweeps import receivers as sweep_receivers

        alert_receivers.connect()
        sweep_receivers.connect()
        # Names each stage's and job's model (stage_record.NAMES_BY_MODEL), which the rows' failure sentences use.
        import runs.pipeline.lifecycle.stages  # noqa: F401
