from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "EAGLE-3 runs"
    default_auto_field = "django.db.models.BigAutoField"
