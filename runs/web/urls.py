from django.urls import path

from runs.checkpoints import serve_check_views
from runs.data import regeneration_views
from runs.sweeps import views as sweep_views
from runs.tracking import curve_api
from runs.web import api, views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/new/", views.run_launch, name="run_launch"),
    path("runs/compare/", views.run_compare, name="run_compare"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/retry/", views.run_retry, name="run_retry"),
    path("runs/<int:pk>/tags/", views.run_tags, name="run_tags"),
    path("sweeps/", sweep_views.sweep_list, name="sweep_list"),
    path("sweeps/<int:pk>/", sweep_views.sweep_detail, name="sweep_detail"),
    path("sweeps/<int:pk>/cancel/", sweep_views.sweep_cancel, name="sweep_cancel"),
    path("workers/", views.worker_list, name="worker_list"),
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/<int:pk>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<int:pk>/catalogue/", views.dataset_catalogue, name="dataset_catalogue"),
    path("datasets/<int:pk>/regenerate/", regeneration_views.dataset_regenerate, name="dataset_regenerate"),
    path("regenerations/<int:pk>/cancel/", regeneration_views.regeneration_cancel, name="regeneration_cancel"),
    path("regenerations/<int:pk>/retry/", regeneration_views.regeneration_retry, name="regeneration_retry"),
    path("extractions/", views.extraction_list, name="extraction_list"),
    path("extractions/import/", views.extraction_import, name="extraction_import"),
    path("extractions/<int:pk>/", views.extraction_detail, name="extraction_detail"),
    path("extractions/<int:pk>/verify/", views.extraction_reverify, name="extraction_verify"),
    path("extractions/<int:pk>/override/", views.extraction_override, name="extraction_override"),
    path("checkpoints/<int:pk>/", views.checkpoint_detail, name="checkpoint_detail"),
    path("checkpoints/<int:pk>/evaluate/", views.checkpoint_evaluate, name="checkpoint_evaluate"),
    path("checkpoints/<int:pk>/serve-check/", serve_check_views.checkpoint_serve_check, name="checkpoint_serve_check"),
    path("reviews/<str:subject>/<int:pk>/", views.review_create, name="review_create"),
    path("api/runs/<int:pk>/", api.run_status, name="api_run_status"),
    path("api/runs/<int:pk>/metrics/", curve_api.run_metrics, name="api_run_metrics"),
    path("api/runs/<int:pk>/metrics/export/", curve_api.run_metrics_export, name="api_run_metrics_export"),
    path("api/targets/inspect/", api.target_inspect, name="api_target_inspect"),
    path("api/workers/", api.worker_list, name="api_worker_list"),
    path("api/sweeps/<int:pk>/", sweep_views.sweep_status, name="api_sweep_status"),
]
