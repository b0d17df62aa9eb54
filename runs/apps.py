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
        # The bell's unread count read in the runs list's own statement; neither domain may import the other.
        from runs.alerts import selectors as alert_selectors
        from runs.saved_views import viewer_reads

        viewer_reads.add_frame_count("alerts_unread", alert_selectors.unread_notices)
        # A run deleted moves the runs list's change count (its state counter went with it).
        from django.db.models.signals import post_delete

        from runs.pipeline.models import PipelineRun
        from runs.pipeline.status import changes

        post_delete.connect(changes.run_deleted, sender=PipelineRun, dispatch_uid="runs_list_run_deleted")
        # Names each stage's and job's model (stage_record.NAMES_BY_MODEL), which the rows' failure sentences use.
        import runs.pipeline.lifecycle.stages  # noqa: F401
