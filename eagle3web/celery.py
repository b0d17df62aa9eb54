import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")

celery_app = Celery("eagle3web")
celery_app.config_from_object("django.conf:settings", namespace="CELERY")
celery_app.autodiscover_tasks(["workers.orchestration"])
