from django.urls import include, path

from runs.checkpoints import serve_check_views
from runs.web import regeneration_views
from runs.projects import views as project_views
from runs.saved_views import views as saved_view_views
from runs.reports import views as report_views
from runs.sweeps import views as sweep_views
from runs.web import demo_views, views

app_name = "runs"
urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/new/", views.run_launch, name="run_launch"),
    path("demo/build/", demo_views.demo_build_again, name="demo_build_again"),
    path("runs/compare/", views.run_compare, name="run_compare"),
    path("runs/bulk/", saved_view_views.runs_bulk, name="runs_bulk"),
    path("views/", saved_view_views.saved_view_save, name="saved_view_save"),
    path("views/<int:pk>/delete/", saved_view_views.saved_view_delete, name="saved_view_delete"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/retry/", views.run_retry, name="run_retry"),
    path("runs/<int:pk>/tags/", views.run_tags, name="run_tags"),
    path("reports/", report_views.report_list, name="report_list"),
    path("reports/new/", report_views.report_new, name="report_new"),
    path("reports/<int:pk>/", report_views.report_detail, name="report_detail"),
    path("reports/<int:pk>/edit/", report_views.report_edit, name="report_edit"),
    path("reports/<int:pk>/versions/", report_views.report_versions, name="report_versions"),
    path("reports/<int:pk>/versions/<int:number>/", report_views.report_version, name="report_version"),
    path("reports/<int:pk>/export/", report_views.report_export, name="report_export"),
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
    path("checkpoints/<int:pk>/export/", serve_check_views.checkpoint_export_view, name="checkpoint_export"),
    path("projects/", project_views.project_list, name="project_list"),
    path("projects/<int:pk>/", project_views.project_detail, name="project_detail"),
    path("reviews/<str:subject>/<int:pk>/", views.review_create, name="review_create"),
    path("alerts/", include("runs.alerts.urls")),
]
